"""Small deterministic data sets and the ``--set`` overrides of a tiny MNIST run."""

from __future__ import annotations

import torch

from alma_daemon.data.datasets import TaskInfo, resolve_data_root
from alma_daemon.data.tensors import LabeledData

#: A small colour-image task (CIFAR-like but 8x8) so VGG-based learners run fast in tests.
TINY_IMAGE_TASK = TaskInfo(
    "classification", (8, 8, 3), 4, mean=(0.5, 0.5, 0.5), std=(0.25, 0.25, 0.25), channels_last=True, augment=True
)


#: ``--set`` overrides for a small MNIST stream (4 chunks of 300, 2 epochs, width 8) that trains in seconds.
TINY_MNIST = [
    "stream.train_examples=1200",
    "stream.megabatches=4",
    "train.epochs=2",
    "learner.width=8",
    "dataset.test_examples=300",
    "device=cpu",
]


def separable_data(task: TaskInfo, n: int, seed: int = 0) -> LabeledData:
    """Examples whose class is written into the mean brightness of a region: learnable in a few epochs."""
    g = torch.Generator().manual_seed(seed)
    y = torch.randint(0, task.num_classes, (n,), generator=g)
    x = torch.randint(0, 100, (n, *task.input_shape), generator=g).float()
    flat = x.view(n, -1)
    width = flat.shape[1] // task.num_classes
    for c in range(task.num_classes):
        rows = y == c
        flat[rows, c * width : (c + 1) * width] += 120
    return LabeledData(x.clamp(0, 255).to(torch.uint8), y)


def have(name: str) -> bool:
    root = resolve_data_root(None)
    return (root / "mnist").is_dir() if name == "mnist" else any(root.glob("**/data_batch_1*"))
