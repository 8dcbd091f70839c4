"""Dataset loaders on the real files (../shared/data or $ALMA_DATA_DIR) and on synthetic copies."""

from __future__ import annotations

import gzip
import pickle
import struct

import numpy as np
import pytest
import torch

from alma_daemon.data.augment import PixelRows, flip_and_crop
from alma_daemon.data.datasets import DatasetError, load_dataset
from tests.helpers.data import have


@pytest.mark.skipif(not have("mnist"), reason="MNIST files not in the data folder (see README: data)")
def test_real_mnist_has_the_published_sizes_and_label_counts():
    data = load_dataset("mnist")
    assert data.train.x.shape == (60000, 28, 28) and data.train.x.dtype == torch.uint8
    assert data.test.x.shape == (10000, 28, 28)
    assert torch.bincount(data.test.y).tolist() == [980, 1135, 1032, 1010, 982, 892, 958, 1028, 974, 1009]


@pytest.mark.skipif(not have("cifar10"), reason="CIFAR-10 files not in the data folder (see README: data)")
def test_real_cifar10_is_hwc_uint8_with_5000_images_per_class():
    data = load_dataset("cifar10")
    assert data.train.x.shape == (50000, 32, 32, 3) and data.train.x.dtype == torch.uint8
    assert torch.bincount(data.train.y).tolist() == [5000] * 10
    mean = data.train.x.float().mean((0, 1, 2)) / 255
    torch.testing.assert_close(mean, torch.tensor([0.4913, 0.4821, 0.4465]), atol=2e-3, rtol=0)


def write_idx(path, array: np.ndarray, magic: int) -> None:
    header = struct.pack(">I", magic) + struct.pack(">" + "I" * array.ndim, *array.shape)
    with gzip.open(path, "wb") as f:
        f.write(header + array.astype(np.uint8).tobytes())


def write_mnist(folder, train: int, test: int, seed: int = 0) -> None:
    rng = np.random.default_rng(seed)
    (folder / "mnist").mkdir(exist_ok=True)
    for stem, n in (("train", train), ("t10k", test)):
        write_idx(folder / "mnist" / f"{stem}-images-idx3-ubyte.gz", rng.integers(0, 255, (n, 28, 28)), 0x803)
        write_idx(folder / "mnist" / f"{stem}-labels-idx1-ubyte.gz", rng.integers(0, 10, n), 0x801)


def test_mnist_from_a_users_folder(tmp_path):
    write_mnist(tmp_path, train=30, test=10)
    data = load_dataset("mnist", str(tmp_path))
    assert len(data.train) == 30 and len(data.test) == 10


def test_mnist_read_again_is_a_copy_of_its_own_and_a_rewritten_file_is_read_anew(tmp_path):
    # The decoded files are kept per process: a caller that writes into its arrays must not change
    # what the next caller reads, and new files must not be hidden behind the old ones.
    write_mnist(tmp_path, train=30, test=10)
    first = load_dataset("mnist", str(tmp_path))
    kept = first.train.x.clone()
    first.train.x.zero_()
    again = load_dataset("mnist", str(tmp_path))
    assert torch.equal(again.train.x, kept) and kept.any()
    write_mnist(tmp_path, train=30, test=10, seed=1)
    rewritten = load_dataset("mnist", str(tmp_path))
    assert len(rewritten.train) == 30 and not torch.equal(rewritten.train.x, kept)


def test_missing_mnist_file_names_the_file_and_the_folder(tmp_path):
    with pytest.raises(DatasetError, match=r"train-images-idx3-ubyte\.gz.*" + str(tmp_path).replace("/", ".")):
        load_dataset("mnist", str(tmp_path))


def test_cifar_binary_and_python_formats_give_the_same_arrays(tmp_path):
    rng = np.random.default_rng(0)
    images = rng.integers(0, 255, (6, 3, 32, 32), dtype=np.uint8)
    labels = rng.integers(0, 10, 6)
    binary, python = tmp_path / "bin" / "cifar-10-batches-bin", tmp_path / "py" / "cifar-10-batches-py"
    binary.mkdir(parents=True)
    python.mkdir(parents=True)
    records = np.concatenate([labels[:, None].astype(np.uint8), images.reshape(6, -1)], axis=1)
    for name in [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]:
        records.tofile(binary / f"{name}.bin")
        # A file we create ourselves, in the official python layout (protocol 2, as distributed).
        (python / name).write_bytes(
            pickle.dumps({b"batch_label": b"x", b"labels": labels.tolist(), b"data": images.reshape(6, -1)}, protocol=2)
        )
    a, b = load_dataset("cifar10", str(tmp_path / "bin")), load_dataset("cifar10", str(tmp_path / "py"))
    assert torch.equal(a.train.x, b.train.x) and torch.equal(a.train.y, b.train.y)
    assert a.train.x.shape == (30, 32, 32, 3)
    assert torch.equal(a.train.x[0], torch.from_numpy(images[0].transpose(1, 2, 0)))


def test_cifar_python_reader_never_runs_code_from_the_file(tmp_path):
    folder = tmp_path / "cifar-10-batches-py"
    folder.mkdir()
    (folder / "data_batch_1").write_bytes(pickle.dumps(Exploit(tmp_path / "pwned")))
    with pytest.raises(ValueError, match="not a CIFAR-10 python batch"):
        load_dataset("cifar10", str(tmp_path))
    assert not (tmp_path / "pwned").exists()


class Exploit:
    """Pickles to a call of os.system: loading it with pickle would create ``marker``."""

    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        import os

        return os.system, (f"touch {self.marker}",)


def test_augmentation_flips_and_shifts_whole_batches():
    n = 16
    x = torch.arange(n * 4 * 4 * 1, dtype=torch.float32).reshape(n, 4, 4, 1) + 1  # distinct pixels, none black
    g = torch.Generator().manual_seed(0)
    out = flip_and_crop(x, g, padding=1)
    assert out.shape == x.shape
    applied = []
    for i in range(n):  # every output image is one (possibly flipped) shifted window of its input
        padded = {
            flipped: torch.nn.functional.pad(c.permute(2, 0, 1), (1, 1, 1, 1)).permute(1, 2, 0)
            for flipped, c in ((False, x[i]), (True, x[i].flip(1)))
        }
        found = [
            (flipped, dy, dx)
            for flipped, p in padded.items()
            for dy in range(3)
            for dx in range(3)
            if torch.equal(out[i], p[dy : dy + 4, dx : dx + 4])
        ]
        assert len(found) == 1, (i, found)
        applied += found
    # The unchanged image is one of the windows too: only a mix of flips and off-centre crops shows augmenting.
    assert {flipped for flipped, _, _ in applied} == {False, True}
    assert any((dy, dx) != (1, 1) for _, dy, dx in applied)


@pytest.mark.parametrize("padding", [1, 4])
def test_pixel_rows_crop_a_stage_exactly_as_flip_and_crop_crops_the_gathered_batch(padding):
    g = torch.Generator().manual_seed(padding)
    stored = torch.randint(0, 256, (12, 3, 7, 5), dtype=torch.uint8, generator=g).permute(0, 2, 3, 1)  # NCHW bytes
    index = torch.tensor([3, 0, 11, 3, 7])
    mean, std = torch.tensor([120.0, 110.0, 100.0]), torch.tensor([60.0, 50.0, 70.0])
    for standardize_ in (None, lambda z: z.sub_(mean).div_(std)):
        draws, twin = torch.Generator().manual_seed(9), torch.Generator().manual_seed(9)
        out = PixelRows(stored, standardize_).flip_and_crop(index, draws, padding)
        expected = flip_and_crop(stored[index], twin, padding)
        if standardize_ is not None:
            expected = (expected - mean).div_(std)
        assert torch.equal(out, expected) and out.stride() == expected.stride()
        assert torch.equal(draws.get_state(), twin.get_state())  # the same draws, nothing more


@pytest.mark.skipif(not have("cifar10"), reason="CIFAR-10 files not in the data folder (see README: data)")
def test_a_test_subset_covers_every_class_even_when_the_test_set_is_sorted_by_class():
    from alma_daemon.config import build_config
    from alma_daemon.research.simulate import simulated_stream

    stream = simulated_stream(build_config({"dataset": {"name": "cifar10", "test_examples": 200}}))
    assert len(stream.test) == 200
    assert len(set(stream.test.y.tolist())) == 10
