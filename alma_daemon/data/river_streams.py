"""River's stream generators and bundled datasets as streams of chunks (``dataset.name: river``).

River (PyPI ``river``, the ``river`` extra) is what stream-learning users reach for; replaying its
streams lets alma-daemon and River's own incremental models be compared on the same examples in the
same order (``benchmarks/bench_river.py``). :data:`RIVER_STREAMS` names each stream: a seeded
generator, with the concept drift it is known for, or a dataset that ships inside River's wheel.
Nothing is downloaded: River's datasets that need a download are not offered. Most are
classification streams; ``friedman`` and ``friedman-drift`` are regressions (a float target).

A stream is read in River's order. Of its first ``dataset.river_examples`` examples, the first nine
tenths arrive as ``stream.megabatches`` contiguous chunks and the last tenth, the stream's
continuation, is the test set: on a drifting stream it measures the concept the stream ends in.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from alma_daemon.config import DatasetConfig
from alma_daemon.data.datasets import DatasetError, TaskInfo
from alma_daemon.data.tensors import LabeledData

#: Share of a stream's examples held out at its end as the test set.
TEST_SHARE = 10
#: Where a drifting generator changes concept, as a share of the examples that arrive as chunks.
HALFWAY = 0.5

#: River's examples: (features by name, label) pairs, in stream order.
Examples = Iterable[tuple[dict[Any, Any], Any]]


@dataclass(frozen=True)
class RiverStream:
    """A named River stream: its examples, their classes (none: a regression) and where its concept changes.

    ``examples(seed, train_length)`` builds River's iterator; a drift is placed relative to the
    ``train_length`` examples that arrive as chunks. ``drift_at`` is the centre of an abrupt or
    gradual drift as a share of those examples (None: no single drift point).
    """

    examples: Callable[[int, int], Examples]
    #: The labels in class-index order; empty for a regression, whose target is a float.
    classes: tuple[Any, ...]
    drift: str
    drift_at: float | None = None
    #: A bundled dataset's number of examples (None: a generator, as long as asked).
    size: int | None = None

    @property
    def regression(self) -> bool:
        return not self.classes


def _synth() -> Any:
    from river.datasets import synth

    return synth


def _datasets() -> Any:
    from river import datasets

    return datasets


def drift_position(share: float, train_length: int) -> int:
    """The 0-based index, among the examples that arrive as chunks, where a drift is centred."""
    return math.floor(share * train_length)


def _agrawal(seed: int, train_length: int) -> Examples:
    synth = _synth()
    return synth.ConceptDriftStream(
        synth.Agrawal(classification_function=1, seed=seed),
        synth.Agrawal(classification_function=2, seed=seed + 1),
        position=drift_position(HALFWAY, train_length),
        # Narrower overflows River's sigmoid (exp of 4 * position / width) far from the drift.
        width=max(1, train_length // 100),
        seed=seed,
    )


def _sea(seed: int, train_length: int) -> Examples:
    synth = _synth()
    return synth.ConceptDriftStream(
        synth.SEA(variant=0, noise=0.1, seed=seed),
        synth.SEA(variant=3, noise=0.1, seed=seed + 1),
        position=drift_position(HALFWAY, train_length),
        width=max(1, train_length // 10),
        seed=seed,
    )


def _hyperplane(seed: int, train_length: int) -> Examples:
    return _synth().Hyperplane(seed=seed, n_features=10, n_drift_features=2, mag_change=0.001, noise_percentage=0.05)


def _rbf_drift(seed: int, train_length: int) -> Examples:
    return _synth().RandomRBFDrift(
        seed_model=seed, seed_sample=seed + 1, n_classes=4, n_features=10, n_centroids=50, change_speed=0.0001
    )


def _friedman(seed: int, train_length: int) -> Examples:
    return _synth().Friedman(seed=seed)


def _friedman_drift(seed: int, train_length: int) -> Examples:
    # River's global recurring drift returns to the first concept at its second change point: placed
    # past the examples read (the test set included), the stream changes concept once.
    after_the_stream = 2 * train_length + 1
    return _synth().FriedmanDrift(
        drift_type="gra", position=(drift_position(HALFWAY, train_length), after_the_stream), seed=seed
    )


def _bananas(seed: int, train_length: int) -> Examples:
    return _datasets().Bananas()


def _image_segments(seed: int, train_length: int) -> Examples:
    return _datasets().ImageSegments()


#: ``dataset.river_stream`` -> the stream (the config lists the same names).
RIVER_STREAMS: dict[str, RiverStream] = {
    "agrawal": RiverStream(
        _agrawal,
        (0, 1),
        "abrupt: Agrawal function 1 -> 2 halfway through the chunks (over a hundredth of them)",
        drift_at=HALFWAY,
    ),
    "sea": RiverStream(
        _sea,
        (False, True),
        "gradual: SEA threshold 8 -> 9.5 (10 % label noise) over a tenth of the chunks, centred halfway",
        drift_at=HALFWAY,
    ),
    "hyperplane": RiverStream(
        _hyperplane, (0, 1), "incremental: a rotating hyperplane (2 of 10 weights drift, 5 % label noise)"
    ),
    "rbf-drift": RiverStream(
        _rbf_drift, (0, 1, 2, 3), "incremental: 50 moving Gaussian centroids, 4 classes (RandomRBFDrift)"
    ),
    "friedman": RiverStream(
        _friedman, (), "none: a regression, Friedman #1 (10 features, 5 of them relevant, unit Gaussian noise)"
    ),
    "friedman-drift": RiverStream(
        _friedman_drift,
        (),
        "abrupt: a regression, Friedman #1 whose relevant features swap places halfway through the chunks "
        "(FriedmanDrift, global drift)",
        drift_at=HALFWAY,
    ),
    "bananas": RiverStream(_bananas, (False, True), "none: River's bundled Bananas (2 features)", size=5300),
    "image-segments": RiverStream(
        _image_segments,
        ("brickface", "cement", "foliage", "grass", "path", "sky", "window"),
        "none: River's bundled ImageSegments (18 features, 7 classes)",
        size=2310,
    ),
}


@dataclass(frozen=True)
class RiverData:
    """A River stream as tensors: the task, the examples that arrive as chunks (in order), the test set."""

    task: TaskInfo
    train: LabeledData
    test: LabeledData
    #: Index (0-based, in ``train``) of the centre of the stream's drift; None: no single drift point.
    drift_at: int | None


def river_stream(name: str) -> RiverStream:
    if name not in RIVER_STREAMS:
        raise DatasetError(f"dataset.river_stream: unknown stream {name!r}; known: {', '.join(RIVER_STREAMS)}")
    return RIVER_STREAMS[name]


def split_lengths(stream: RiverStream, examples: int) -> tuple[int, int]:
    """(examples that arrive as chunks, test examples) of a stream asked for ``examples`` examples."""
    total = min(examples, stream.size) if stream.size is not None else examples
    test = total // TEST_SHARE
    if test == 0:
        raise DatasetError(f"dataset.river_examples: {examples} leaves no test examples; ask for at least {TEST_SHARE}")
    return total - test, test


def read_river(name: str, examples: int, seed: int) -> RiverData:
    """River stream ``name``: its first ``examples`` examples (a bundled dataset: at most its size),
    generated with ``seed``, as float32 features and class indices (a regression: float32 targets);
    River is imported here."""
    stream = river_stream(name)
    train_length, test_length = split_lengths(stream, examples)
    try:
        source = stream.examples(seed, train_length)
    except ImportError as error:
        raise DatasetError(f"dataset.name=river needs River: pip install 'alma-daemon[river]' ({error})") from error
    pairs = list(itertools.islice(source, train_length + test_length))
    features = list(pairs[0][0])
    x = np.array([[float(example[f]) for f in features] for example, _ in pairs], dtype=np.float32)
    if not np.isfinite(x).all():
        raise DatasetError(f"River stream {name!r}: non-finite feature values")
    y = targets(name, stream, [label for _, label in pairs])
    task = TaskInfo(
        "regression" if stream.regression else "classification",
        (len(features),),
        max(1, len(stream.classes)),
        normalization="standardize",
        extra={"river_stream": name, "features": [str(f) for f in features], "drift": stream.drift},
    )
    data = LabeledData(torch.from_numpy(x), torch.from_numpy(y))
    drift_at = None if stream.drift_at is None else drift_position(stream.drift_at, train_length)
    return RiverData(
        task,
        data.subset(torch.arange(train_length)),
        data.subset(torch.arange(train_length, train_length + test_length)),
        drift_at,
    )


def targets(name: str, stream: RiverStream, labels: list[Any]) -> np.ndarray:
    """A classifier's labels as their classes' indexes (int64), a regression's targets as float32."""
    if stream.regression:
        y = np.array(labels, dtype=np.float32)
        if not np.isfinite(y).all():
            raise DatasetError(f"River stream {name!r}: non-finite targets")
        return y
    index = {label: i for i, label in enumerate(stream.classes)}
    unknown = set(labels) - set(index)
    if unknown:
        raise DatasetError(f"River stream {name!r}: labels {sorted(map(str, unknown))} not among {stream.classes}")
    return np.array([index[label] for label in labels], dtype=np.int64)


def read_configured_river(dataset: DatasetConfig, seed: int) -> RiverData:
    """The River stream ``dataset.river_stream`` as ``dataset`` asks for it (``seed``: ``stream.seed``)."""
    return read_river(dataset.river_stream, dataset.river_examples, seed)
