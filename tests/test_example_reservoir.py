"""The example reservoirs behind the pooled validation set and the class-aware replay set."""

from __future__ import annotations

import pytest
import torch

from alma_daemon.core.example_reservoir import ExampleReservoir, proportional_quotas
from alma_daemon.data.streams import SplitChunk
from alma_daemon.data.tensors import LabeledData


def chunk_of(chunk: int, positives: int, negatives: int) -> tuple[int, LabeledData]:
    """A chunk whose examples' first feature is the chunk id, the second its index in the chunk."""
    n = positives + negatives
    x = torch.stack([torch.full((n,), float(chunk)), torch.arange(n, dtype=torch.float32)], dim=1)
    y = torch.cat([torch.ones(positives, dtype=torch.long), torch.zeros(negatives, dtype=torch.long)])
    return chunk, LabeledData(x, y)


def fed(chunks: list[tuple[int, LabeledData]], capacity: int, floor: int = 0, half_life: float | None = None):
    reservoir = ExampleReservoir.empty(chunks[0][1], 2)
    for part in chunks:
        reservoir = reservoir.offered([part], 0, "test", capacity, proportional_quotas(floor), half_life)
    return reservoir


def test_quotas_follow_the_stream_with_a_floor_and_the_largest_class_gives_way():
    quotas = proportional_quotas(30)
    assert quotas([10, 5], 100) == [10, 5]  # everything fits
    assert quotas([9_900, 100], 1_000) == [970, 30]  # 1 % positives, held at the floor of 30
    assert quotas([9_990, 10], 1_000) == [990, 10]  # the floor takes what the stream has had
    assert quotas([5_000, 5_000], 1_000) == [500, 500]
    assert sum(proportional_quotas(0)([7_000, 2_000, 1_000], 999)) == 999


def test_the_reservoir_is_bounded_keeps_the_floor_of_positives_and_counts_what_it_saw():
    chunks = [chunk_of(c, positives=2, negatives=98) for c in range(1, 21)]
    reservoir = fed(chunks, capacity=200, floor=30)
    assert len(reservoir) == 200
    assert int(reservoir.data.y.sum()) == 30  # 40 seen, 2 % of 200 is 4: the floor keeps 30
    assert reservoir.seen == (1_960, 40)
    # The floor's positives weigh back to the stream's mix: 2 %.
    weights = reservoir.stream_weights(reservoir.data.y)
    share = float((weights * reservoir.data.y).sum() / weights.sum())
    assert share == pytest.approx(0.02)


def test_the_same_offers_keep_the_same_examples_and_one_restored_from_its_tensors_goes_on_alike():
    chunks = [chunk_of(c, positives=3, negatives=47) for c in range(1, 13)]
    first, second = fed(chunks, capacity=120), fed(chunks, capacity=120)
    assert torch.equal(first.data.x, second.data.x) and torch.equal(first.ranks, second.ranks)
    restored = ExampleReservoir.from_tensors(fed(chunks[:6], capacity=120).tensors())
    for part in chunks[6:]:
        restored = restored.offered([part], 0, "test", 120, proportional_quotas(0))
    assert torch.equal(restored.data.x, first.data.x) and restored.seen == first.seen


def test_a_half_life_keeps_mostly_recent_chunks_and_without_one_the_sample_is_uniform():
    chunks = [chunk_of(c, positives=0, negatives=100) for c in range(1, 41)]
    recent = fed(chunks, capacity=400, half_life=1.0)
    uniform = fed(chunks, capacity=400)
    assert float(recent.data.x[:, 0].mean()) > 35  # mostly the last chunks
    assert 15 < float(uniform.data.x[:, 0].mean()) < 26  # about the stream's middle, 20.5
    # Its examples are in ascending rank: the newest come first.
    assert float(recent.data.x[:50, 0].mean()) > float(recent.data.x[-50:, 0].mean()) + 1


def test_a_sample_takes_each_class_quota_of_the_lowest_ranks():
    chunks = [chunk_of(c, positives=1, negatives=49) for c in range(1, 11)]
    reservoir = fed(chunks, capacity=500, half_life=1.0)
    sample = reservoir.sample(100, proportional_quotas(5))
    assert len(sample) == 100 and int(sample.y.sum()) == 5
    assert float(sample.x[sample.y == 0, 0].mean()) > 8  # mostly the newest negatives
    assert reservoir.sample(10_000, proportional_quotas(5)) is reservoir.data


def test_a_regressions_examples_are_one_stratum():
    x = torch.randn(300, 3)
    splits = [
        SplitChunk(
            c, LabeledData(x[c * 100 : c * 100 + 90], x[c * 100 : c * 100 + 90, 0]), LabeledData(x[:0], x[:0, 0])
        )
        for c in range(3)
    ]
    reservoir = ExampleReservoir.empty(splits[0].train, 1).offered_splits(
        splits, "train", 0, 100, proportional_quotas(0)
    )
    assert len(reservoir) == 100 and reservoir.seen == (270,)
