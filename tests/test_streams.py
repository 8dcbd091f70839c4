"""Stream construction (paper section 5): equal, disjoint, seeded mega-batches and chunk splits."""

from __future__ import annotations

import torch

from alma_daemon.data.streams import Chunk, megabatch_stream, ordered_stream, partition, split_chunk
from alma_daemon.data.tensors import LabeledData


def numbered(n: int) -> LabeledData:
    """Examples whose single feature is their own index, so provenance can be checked."""
    return LabeledData(torch.arange(n)[:, None], torch.arange(n) % 10)


def ids(data: LabeledData) -> set[int]:
    return set(data.x[:, 0].tolist())


def test_partition_is_equal_sized_disjoint_and_covers_the_data():
    parts = partition(numbered(1003), 10, seed=0)
    assert [len(p) for p in parts] == [100] * 10
    seen = [ids(p) for p in parts]
    assert sum(len(s) for s in seen) == len(set().union(*seen)) == 1000


def test_partition_depends_on_the_seed_only():
    a = [ids(p) for p in partition(numbered(500), 5, seed=3)]
    b = [ids(p) for p in partition(numbered(500), 5, seed=3)]
    c = [ids(p) for p in partition(numbered(500), 5, seed=4)]
    assert a == b
    assert a != c


def test_partition_is_random_not_the_dataset_order():
    first = ids(partition(numbered(1000), 10, seed=0)[0])
    assert first != set(range(100))


def test_limit_uses_a_subset_of_the_shuffled_data():
    parts = partition(numbered(1000), 4, seed=0, limit=200)
    assert [len(p) for p in parts] == [50] * 4


def test_stream_yields_chunks_numbered_from_one():
    chunks = list(megabatch_stream(numbered(100), 4, seed=0))
    assert [c.index for c in chunks] == [1, 2, 3, 4]


def test_an_ordered_stream_keeps_the_data_order_in_equal_contiguous_chunks():
    chunks = list(ordered_stream(numbered(103), 4))
    assert [c.index for c in chunks] == [1, 2, 3, 4]
    assert [c.data.x[:, 0].tolist() for c in chunks] == [list(range(i * 25, (i + 1) * 25)) for i in range(4)]


def test_an_ordered_streams_limit_takes_the_first_examples():
    chunks = list(ordered_stream(numbered(1000), 2, limit=10))
    assert [c.data.x[:, 0].tolist() for c in chunks] == [[0, 1, 2, 3, 4], [5, 6, 7, 8, 9]]


def test_split_holds_out_ten_percent_deterministically():
    chunk = Chunk(7, numbered(200))
    split = split_chunk(chunk, 0.1, seed=0)
    assert (len(split.train), len(split.val)) == (180, 20)
    assert ids(split.train).isdisjoint(ids(split.val))
    assert ids(split.train) | ids(split.val) == ids(chunk.data)
    again = split_chunk(chunk, 0.1, seed=0)
    assert ids(again.val) == ids(split.val)
    other_chunk = split_chunk(Chunk(8, numbered(200)), 0.1, seed=0)
    assert ids(other_chunk.val) != ids(split.val)


def test_split_keeps_at_least_one_example_on_each_side():
    split = split_chunk(Chunk(1, numbered(3)), 0.1, seed=0)
    assert (len(split.train), len(split.val)) == (2, 1)
