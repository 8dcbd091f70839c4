"""Event records (docs/wire-format.md, "Event records"): JSON and safetensors-rows round trips, every
rejection reason, and ``alma replay --events`` through the Redis-stream transport and Kafka."""

from __future__ import annotations

import dataclasses
import itertools
import json
import pickle
import time
import timeit
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import pytest
import safetensors.torch
import torch

from alma_daemon.cli import build_parser
from alma_daemon.data.events import EVENT_JSON, EVENT_ROWS, decode_event, encode_events
from alma_daemon.data.wire import CONTENT_TYPE, REJECT_REASONS, RejectedRecord, StreamSchema, WireRecord, encode_chunk
from alma_daemon.transports.redis_stream import RedisStreamPublisher, decode_entry, encode_entry
from alma_daemon.transports.replay import EventFormat, RecordFormat, ReplayChunk, replay

MNIST = StreamSchema("labeled", (28, 28), num_classes=10)
FEATURES = ("age", "income")
TABULAR = StreamSchema("labeled", (2,), num_classes=3)
#: A team's streams: two named classes, and a regression's float targets, on unbounded features.
FRAUD = StreamSchema("labeled", (2,), num_classes=2, pixel_range=False, classes=("ok", "fraud"))
AMOUNT = StreamSchema("labeled", (2,), pixel_range=False, regression=True)
JSON_HEADERS = [("content-type", EVENT_JSON.encode())]
ROWS_HEADERS = [("content-type", EVENT_ROWS.encode())]


def digits(n: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, 256, (n, 28, 28), generator=g, dtype=torch.uint8), torch.randint(0, 10, (n,), generator=g)


def decode_all(records: list[WireRecord], schema: StreamSchema = MNIST, features: tuple[str, ...] = ()):
    decoded = [decode_event(r.value, r.headers, schema, features) for r in records]
    return torch.cat([x for x, _ in decoded]), torch.cat([y for _, y in decoded])


def as_json(doc: object) -> bytes:
    return json.dumps(doc).encode()


# -- round trips ------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("per_record", [1, 2, 7])
@pytest.mark.parametrize("content_type", [EVENT_JSON, EVENT_ROWS])
def test_decoded_examples_equal_the_encoded_ones(content_type: str, per_record: int) -> None:
    x, y = digits(7)
    records = encode_events(x, y, content_type, per_record=per_record)
    assert len(records) == -(-7 // per_record)
    assert all(r.key is None and r.headers == [("content-type", content_type.encode())] for r in records)
    got_x, got_y = decode_all(records)
    # JSON carries numbers, which the daemon reads as float32; rows keep the dtype sent.
    assert got_x.dtype == (torch.float32 if content_type == EVENT_JSON else torch.uint8)
    assert torch.equal(got_x, x.to(got_x.dtype)) and torch.equal(got_y, y)


def test_float32_examples_survive_json_exactly() -> None:
    x = torch.rand(5, 28, 28) * 255  # values with all 24 bits of mantissa in use
    y = torch.arange(5)
    got_x, got_y = decode_all(encode_events(x, y, per_record=2))
    assert torch.equal(got_x, x) and torch.equal(got_y, y)


def test_json_forms_one_example_and_a_few() -> None:
    x, y = digits(3)
    one, few = encode_events(x[:1], y[:1])[0], encode_events(x, y, per_record=3)[0]
    assert json.loads(one.value) == {"x": x[0].flatten().tolist(), "y": int(y[0])}
    assert json.loads(few.value) == {"x": x.reshape(3, -1).tolist(), "y": y.tolist()}
    assert b" " not in one.value  # compact: no spaces after separators


def test_json_x_may_be_nested_as_the_example_shape() -> None:
    x, y = digits(3)
    one = as_json({"x": x[0].tolist(), "y": int(y[0])})
    few = as_json({"x": x.tolist(), "y": y.tolist()})
    got_one, _ = decode_event(one, JSON_HEADERS, MNIST)
    got_few, got_y = decode_event(few, JSON_HEADERS, MNIST)
    assert torch.equal(got_one, x[:1].float()) and torch.equal(got_few, x.float()) and torch.equal(got_y, y)


def test_named_features_single_and_a_few() -> None:
    x, y = decode_event(as_json({"age": 31, "income": 2.5, "y": 1}), JSON_HEADERS, TABULAR, FEATURES)
    assert torch.equal(x, torch.tensor([[31.0, 2.5]])) and torch.equal(y, torch.tensor([1]))
    few = as_json({"income": [2.5, 4.0], "age": [31, 40], "y": [1, 2]})  # field order is free
    x, y = decode_event(few, JSON_HEADERS, TABULAR, FEATURES)
    assert torch.equal(x, torch.tensor([[31.0, 2.5], [40.0, 4.0]])) and torch.equal(y, torch.tensor([1, 2]))


@pytest.mark.parametrize("per_record", [1, 3])
def test_named_features_round_trip(per_record: int) -> None:
    x, y = torch.rand(5, 2) * 100, torch.tensor([0, 1, 2, 1, 0])
    records = encode_events(x, y, features=FEATURES, per_record=per_record)
    assert set(json.loads(records[0].value)) == {"age", "income", "y"}
    got_x, got_y = decode_all(records, TABULAR, FEATURES)
    assert torch.equal(got_x, x) and torch.equal(got_y, y)


def test_encoding_is_deterministic_and_the_key_is_the_producers() -> None:
    x, y = digits(4)
    for content_type in (EVENT_JSON, EVENT_ROWS):
        assert encode_events(x, y, content_type, per_record=3) == encode_events(x, y, content_type, per_record=3)
    keyed = encode_events(x, y, key=b"sensor-7")
    assert {r.key for r in keyed} == {b"sensor-7"}


def test_other_headers_are_ignored() -> None:
    x, y = digits(1)
    record = encode_events(x, y)[0]
    headers = [("traceparent", b"00-abc"), ("alma-chunk", b"x"), ("alma-chunk", b"y"), *record.headers]
    got_x, _ = decode_event(record.value, headers, MNIST)
    assert torch.equal(got_x, x.float())


@pytest.mark.parametrize(
    "kwargs",
    [
        {"content_type": "text/csv"},
        {"per_record": 0},
        {"features": FEATURES, "content_type": EVENT_ROWS},
        {"features": ("a", "b", "c")},
        {"max_part_bytes": 10},
    ],
)
def test_encoding_refuses_what_no_consumer_would_take(kwargs: dict) -> None:
    with pytest.raises(ValueError):
        encode_events(torch.full((2, 2), 3.0), torch.tensor([0, 1]), **kwargs)


def test_encoding_refuses_non_finite_floats() -> None:
    with pytest.raises(ValueError):
        encode_events(torch.tensor([[float("nan"), 1.0]]), torch.tensor([0]))


# -- rejections -------------------------------------------------------------------------------------------------------
def mnist_json(x: object = None, y: object = 3, **extra: object) -> bytes:
    return as_json({"x": [0] * 784 if x is None else x, "y": y, **extra})


def rows(x: torch.Tensor, y: torch.Tensor, **extra: torch.Tensor) -> bytes:
    return safetensors.torch.save({"x": x, "y": y, **extra})


@dataclass(frozen=True)
class Case:
    value: Callable[[], bytes | None]
    reason: str
    headers: object = dataclasses.field(default_factory=lambda: JSON_HEADERS)
    schema: StreamSchema = MNIST
    features: tuple[str, ...] = ()


def tabular(**doc: object) -> Callable[[], bytes]:
    return lambda: as_json(doc)


def pixels_with(value: str) -> Callable[[], bytes]:
    """An MNIST event whose first pixel is written as the raw JSON text ``value``."""
    return lambda: b'{"x": [' + value.encode() + b", 0" * 783 + b'], "y": 3}'


CASES: dict[str, Case] = {
    # headers
    "headers-none": Case(mnist_json, "headers", headers=None),
    "headers-no-content-type": Case(mnist_json, "headers", headers=[("traceparent", b"00")]),
    "headers-chunk-content-type": Case(mnist_json, "headers", headers=[("content-type", CONTENT_TYPE.encode())]),
    "headers-content-type-with-parameters": Case(
        mnist_json, "headers", headers=[("content-type", b"application/json; charset=utf-8")]
    ),
    "headers-content-type-twice": Case(mnist_json, "headers", headers=JSON_HEADERS * 2),
    "headers-content-type-none": Case(mnist_json, "headers", headers=[("content-type", None)]),
    "headers-not-a-pair": Case(mnist_json, "headers", headers=[*JSON_HEADERS, ("content-type",)]),
    "headers-not-a-list": Case(mnist_json, "headers", headers=42),
    # size
    "size-over-the-limit": Case(mnist_json, "size", schema=dataclasses.replace(MNIST, max_part_bytes=1000)),
    # decode
    "decode-tombstone": Case(lambda: None, "decode"),
    "decode-not-json": Case(lambda: b"x=1,y=3", "decode"),
    "decode-truncated-json": Case(lambda: mnist_json()[:-1], "decode"),
    "decode-not-utf8": Case(lambda: b'{"x": [0], "y": 3, "\xff": 1}', "decode"),
    "decode-json-array": Case(lambda: as_json([[0] * 784, 3]), "decode"),
    "decode-json-number": Case(lambda: b"3", "decode"),
    "decode-rows-garbage": Case(lambda: b"not safetensors", "decode", headers=ROWS_HEADERS),
    "decode-rows-pickle": Case(lambda: pickle.dumps({"x": [0], "y": 3}), "decode", headers=ROWS_HEADERS),
    "decode-json-sent-as-rows": Case(mnist_json, "decode", headers=ROWS_HEADERS),
    "decode-rows-extra-tensor": Case(lambda: rows(*digits(2), z=torch.zeros(1)), "decode", headers=ROWS_HEADERS),
    "decode-rows-missing-y": Case(lambda: safetensors.torch.save({"x": digits(1)[0]}), "decode", headers=ROWS_HEADERS),
    # fields
    "fields-extra": Case(lambda: mnist_json(id=12), "fields"),
    "fields-missing-y": Case(lambda: as_json({"x": [0] * 784}), "fields"),
    "fields-missing-x": Case(lambda: as_json({"y": 3}), "fields"),
    "fields-feature-missing": Case(tabular(age=31, y=1), "fields", schema=TABULAR, features=FEATURES),
    "fields-feature-extra": Case(tabular(age=31, income=2.5, city=3, y=1), "fields", schema=TABULAR, features=FEATURES),
    "fields-x-on-a-features-stream": Case(tabular(x=[31, 2.5], y=1), "fields", schema=TABULAR, features=FEATURES),
    # dtype
    "dtype-bool-label": Case(lambda: mnist_json(y=True), "dtype"),
    "dtype-float-label": Case(lambda: mnist_json(y=3.5), "dtype"),
    "dtype-integral-float-label": Case(lambda: mnist_json(y=3.0), "dtype"),
    "dtype-string-label": Case(lambda: mnist_json(y="3"), "dtype"),
    "dtype-null-label": Case(lambda: mnist_json(y=None), "dtype"),
    "dtype-bool-among-labels": Case(lambda: mnist_json(x=[[0] * 784] * 2, y=[1, False]), "dtype"),
    "dtype-bool-in-x": Case(pixels_with("true"), "dtype"),
    "dtype-string-in-x": Case(pixels_with('"7"'), "dtype"),
    "dtype-null-in-x": Case(pixels_with("null"), "dtype"),
    "dtype-bool-feature": Case(tabular(age=True, income=2.5, y=1), "dtype", schema=TABULAR, features=FEATURES),
    "dtype-string-feature": Case(tabular(age="31", income=2.5, y=1), "dtype", schema=TABULAR, features=FEATURES),
    "dtype-string-among-features": Case(
        tabular(age=[31, "40"], income=[2.5, 4.0], y=[1, 2]), "dtype", schema=TABULAR, features=FEATURES
    ),
    "dtype-class-name-on-a-stream-without-names": Case(
        tabular(age=31, income=2.5, y="fraud"), "dtype", schema=TABULAR, features=FEATURES
    ),
    "dtype-string-target": Case(tabular(age=31, income=2.5, y="12.5"), "dtype", schema=AMOUNT, features=FEATURES),
    "dtype-bool-target": Case(tabular(age=31, income=2.5, y=True), "dtype", schema=AMOUNT, features=FEATURES),
    "dtype-rows-int-targets": Case(
        lambda: rows(torch.zeros(2, 2), torch.tensor([1, 2])), "dtype", headers=ROWS_HEADERS, schema=AMOUNT
    ),
    "dtype-rows-float-labels": Case(
        lambda: rows(torch.zeros(2, 2), torch.tensor([0.0, 1.0])), "dtype", headers=ROWS_HEADERS, schema=FRAUD
    ),
    "dtype-rows-x-float64": Case(
        lambda: rows(torch.zeros(2, 28, 28, dtype=torch.float64), torch.tensor([1, 2])), "dtype", headers=ROWS_HEADERS
    ),
    "dtype-rows-y-int32": Case(
        lambda: rows(digits(2)[0], torch.tensor([1, 2], dtype=torch.int32)), "dtype", headers=ROWS_HEADERS
    ),
    "dtype-json-on-a-uint8-only-stream": Case(
        mnist_json, "dtype", schema=dataclasses.replace(MNIST, x_dtypes=("uint8",))
    ),
    # shape
    "shape-x-too-short": Case(lambda: mnist_json(x=[0] * 783), "shape"),
    "shape-x-too-long": Case(lambda: mnist_json(x=[0] * 785), "shape"),
    "shape-x-nested-wrong": Case(lambda: mnist_json(x=[[0] * 27] * 28), "shape"),
    "shape-x-a-number": Case(lambda: mnist_json(x=5), "shape"),
    "shape-x-an-object": Case(lambda: mnist_json(x={"0": 1}), "shape"),
    "shape-one-label-for-a-list-of-examples": Case(lambda: mnist_json(x=[[0] * 784]), "shape"),
    "shape-fewer-examples-than-labels": Case(lambda: mnist_json(x=[[0] * 784] * 2, y=[1, 2, 3]), "shape"),
    "shape-ragged-examples": Case(lambda: mnist_json(x=[[0] * 784, [0] * 783], y=[1, 2]), "shape"),
    "shape-no-examples": Case(lambda: mnist_json(x=[], y=[]), "shape"),
    "shape-feature-list-for-one-label": Case(
        tabular(age=[31], income=2.5, y=1), "shape", schema=TABULAR, features=FEATURES
    ),
    "shape-feature-lists-of-other-lengths": Case(
        tabular(age=[31, 40], income=[2.5], y=[1, 2]), "shape", schema=TABULAR, features=FEATURES
    ),
    "shape-rows-flattened": Case(
        lambda: rows(torch.zeros(2, 784, dtype=torch.uint8), torch.tensor([1, 2])), "shape", headers=ROWS_HEADERS
    ),
    "shape-rows-no-examples": Case(
        lambda: rows(torch.zeros(0, 28, 28, dtype=torch.uint8), torch.zeros(0, dtype=torch.int64)),
        "shape",
        headers=ROWS_HEADERS,
    ),
    # label range
    "label_range-equals-num-classes": Case(lambda: mnist_json(y=10), "label_range"),
    "label_range-negative": Case(lambda: mnist_json(x=[[0] * 784] * 2, y=[1, -1]), "label_range"),
    "label_range-beyond-int64": Case(lambda: mnist_json(y=2**70), "label_range"),
    "label_range-rows": Case(lambda: rows(digits(2)[0], torch.tensor([1, 10])), "label_range", headers=ROWS_HEADERS),
    "label_range-unknown-class-name": Case(
        tabular(age=31, income=2.5, y="frod"), "label_range", schema=FRAUD, features=FEATURES
    ),
    "label_range-index-beside-names": Case(
        tabular(age=[31, 40], income=[2.5, 4.0], y=["fraud", 2]), "label_range", schema=FRAUD, features=FEATURES
    ),
    # non-finite
    "non_finite-nan-literal": Case(pixels_with("NaN"), "non_finite"),
    "non_finite-infinity-literal": Case(pixels_with("Infinity"), "non_finite"),
    "non_finite-minus-infinity-literal": Case(pixels_with("-Infinity"), "non_finite"),
    "non_finite-nan-label": Case(lambda: b'{"x": [0], "y": NaN}', "non_finite"),
    "non_finite-overflowing-float": Case(pixels_with("1e999"), "non_finite"),
    "non_finite-beyond-float32": Case(pixels_with("1e300"), "non_finite"),
    "non_finite-overflowing-integer": Case(pixels_with("9" * 400), "non_finite"),
    "non_finite-nan-target": Case(
        lambda: b'{"age": 31, "income": 2.5, "y": NaN}', "non_finite", schema=AMOUNT, features=FEATURES
    ),
    "non_finite-target-beyond-float32": Case(
        tabular(age=31, income=2.5, y=1e39), "non_finite", schema=AMOUNT, features=FEATURES
    ),
    "non_finite-rows-inf-target": Case(
        lambda: rows(torch.zeros(1, 2), torch.tensor([float("inf")])), "non_finite", headers=ROWS_HEADERS, schema=AMOUNT
    ),
    "non_finite-rows": Case(
        lambda: rows(torch.full((1, 28, 28), float("inf")), torch.tensor([1])), "non_finite", headers=ROWS_HEADERS
    ),
    # value range
    "value_range-negative": Case(pixels_with("-1"), "value_range"),
    "value_range-above-255": Case(pixels_with("255.5"), "value_range"),
    "value_range-feature": Case(tabular(age=31, income=-2.5, y=1), "value_range", schema=TABULAR, features=FEATURES),
}


@pytest.mark.parametrize("name", list(CASES))
def test_bad_event_is_rejected_with_its_reason(name: str) -> None:
    case = CASES[name]
    with pytest.raises(RejectedRecord) as caught:
        decode_event(case.value(), case.headers, case.schema, case.features)
    assert caught.value.reason == case.reason, caught.value.detail
    assert caught.value.detail


def test_every_reason_an_event_can_meet_has_a_concrete_bad_event() -> None:
    # The others concern chunk headers and chunk order, which event records do not have.
    chunk_only = {"schema", "stream", "part_numbering", "chunk_order", "chunk_ahead", "incomplete"}
    assert {case.reason for case in CASES.values()} == set(REJECT_REASONS) - chunk_only
    assert all(name.split("-")[0] == case.reason for name, case in CASES.items())


def test_new_reasons_come_last_so_the_others_keep_their_order() -> None:
    assert REJECT_REASONS[-4:] == ("chunk_order", "chunk_ahead", "fields", "incomplete")


def test_a_100_mb_event_is_rejected_by_size_without_being_parsed() -> None:
    huge = b"[" * (100 << 20)  # would parse for seconds, or overflow the parser's recursion
    start = time.perf_counter()
    with pytest.raises(RejectedRecord) as caught:
        decode_event(huge, JSON_HEADERS, MNIST)
    assert caught.value.reason == "size"
    assert time.perf_counter() - start < 0.05


def test_a_json_mnist_event_decodes_in_well_under_a_millisecond() -> None:
    record = encode_events(*digits(1))[0]
    best = min(timeit.repeat(lambda: decode_event(record.value, record.headers, MNIST), number=50, repeat=5)) / 50
    assert best < 1e-3, f"{best * 1e6:.0f} µs per event"


def test_a_caller_passing_features_that_cannot_match_the_schema_gets_a_value_error() -> None:
    with pytest.raises(ValueError):
        decode_event(mnist_json(), JSON_HEADERS, MNIST, FEATURES)
    with pytest.raises(ValueError):
        decode_event(b"{}", JSON_HEADERS, StreamSchema("text", vocab_size=10))


# -- a team's labels: class names and a regression's targets ---------------------------------------------------------
def test_a_label_may_be_its_class_name_or_its_index() -> None:
    x, y = decode_event(as_json({"age": 31, "income": -2.5, "y": "fraud"}), JSON_HEADERS, FRAUD, FEATURES)
    assert torch.equal(x, torch.tensor([[31.0, -2.5]])) and torch.equal(y, torch.tensor([1]))
    few = as_json({"age": [31, 40, 52], "income": [2.5, 4.0, 1.0], "y": ["ok", 1, "fraud"]})
    assert torch.equal(decode_event(few, JSON_HEADERS, FRAUD, FEATURES)[1], torch.tensor([0, 1, 1]))
    x_only = as_json({"x": [1.0, 2.0], "y": "ok"})
    assert torch.equal(decode_event(x_only, JSON_HEADERS, FRAUD)[1], torch.tensor([0]))


def test_an_unknown_class_name_is_refused_naming_it_and_the_classes() -> None:
    with pytest.raises(RejectedRecord, match=r"label_range: label 'frod' is not a class; the classes are ok, fraud"):
        decode_event(as_json({"age": 31, "income": 2.5, "y": "frod"}), JSON_HEADERS, FRAUD, FEATURES)


def test_a_string_feature_is_refused_naming_its_field() -> None:
    few = as_json({"age": [31, 40], "income": [2.5, "4.0"], "y": [1, 0]})
    with pytest.raises(RejectedRecord, match=r"dtype: field 'income' is \[2.5, \"4.0\"\]"):
        decode_event(few, JSON_HEADERS, FRAUD, FEATURES)
    with pytest.raises(RejectedRecord, match=r"shape: field 'income' is \[2.5\], not a list of 2 numbers"):
        decode_event(as_json({"age": [31, 40], "income": [2.5], "y": [1, 0]}), JSON_HEADERS, FRAUD, FEATURES)


@pytest.mark.parametrize("target,expected", [(12.75, [12.75]), (-3, [-3.0]), ([0.5, 1e30], [0.5, 1e30])])
def test_a_regression_target_is_any_finite_number_read_as_float32(target: object, expected: list[float]) -> None:
    n = len(expected)
    doc = {"age": [31] * n, "income": [2.5] * n, "y": target} if n > 1 else {"age": 31, "income": 2.5, "y": target}
    _, y = decode_event(as_json(doc), JSON_HEADERS, AMOUNT, FEATURES)
    assert y.dtype == torch.float32 and torch.equal(y, torch.tensor(expected, dtype=torch.float32))


@pytest.mark.parametrize("content_type", [EVENT_JSON, EVENT_ROWS])
def test_regression_targets_round_trip_exactly(content_type: str) -> None:
    x, y = torch.rand(5, 2) * 100 - 50, torch.randn(5) * 1e3
    features = FEATURES if content_type == EVENT_JSON else ()
    records = encode_events(x, y, content_type, features, per_record=2)
    got_x, got_y = decode_all(records, AMOUNT, features)
    assert got_y.dtype == torch.float32 and torch.equal(got_y, y) and torch.equal(got_x, x)


def test_a_schema_refuses_class_names_that_do_not_fit() -> None:
    with pytest.raises(ValueError, match="classes name 3 classes, but num_classes is 2"):
        StreamSchema("labeled", (2,), num_classes=2, classes=("a", "b", "c"))
    with pytest.raises(ValueError, match="distinct strings"):
        StreamSchema("labeled", (2,), num_classes=2, classes=("a", "a"))
    with pytest.raises(ValueError, match="a regression stream has none"):
        StreamSchema("labeled", (2,), num_classes=2, classes=("a", "b"), regression=True)


# -- transports and replay -------------------------------------------------------------------------------------------
def test_a_chunk_parts_redis_entry_is_unchanged_and_an_event_entry_has_no_key() -> None:
    part = encode_chunk("mnist", 1, *digits(2))[0]
    assert list(encode_entry(part)) == ["key", "value", "headers"]
    assert decode_entry({k.encode(): v for k, v in encode_entry(part).items()})[:3] == (
        part.key,
        part.value,
        part.headers,
    )
    event = encode_events(*digits(1))[0]
    fields = {k.encode(): v for k, v in encode_entry(event).items()}
    assert b"key" not in fields
    assert decode_entry(fields) == (None, event.value, event.headers, None)


def chunks_of(x: torch.Tensor, y: torch.Tensor, size: int) -> list[ReplayChunk]:
    return [
        ReplayChunk(i + 1, {"x": x[lo : lo + size], "y": y[lo : lo + size]})
        for i, lo in enumerate(range(0, len(y), size))
    ]


def stream_events(client, name: str, schema: StreamSchema = MNIST, features: tuple[str, ...] = ()):
    """Every entry of a Redis stream, read back as the ingest reads it: ``(keys, x, y)``."""
    keys, xs, ys = [], [], []
    for _, fields in client.xrange(name):
        key, value, headers, problem = decode_entry(fields)
        assert problem is None
        x, y = decode_event(value, headers, schema, features)
        keys.append(key)
        xs.append(x)
        ys.append(y)
    return keys, torch.cat(xs), torch.cat(ys)


@pytest.mark.integration
@pytest.mark.parametrize("content_type", [EVENT_JSON, EVENT_ROWS])
def test_replay_sends_each_chunks_examples_as_event_records(redis_db, content_type: str) -> None:
    x, y = digits(10)
    report = replay(
        chunks_of(x, y, 4),
        RedisStreamPublisher(redis_db, "alma.events"),
        "mnist",
        progress=False,
        wire=RecordFormat(events=EventFormat(content_type, per_record=3)),
    )
    assert (report.chunks, report.records) == (3, 2 + 2 + 1)  # chunks of 4, 4, 2 examples
    keys, got_x, got_y = stream_events(redis_db, "alma.events")
    assert keys == [None] * 5
    assert torch.equal(got_x, x.to(got_x.dtype)) and torch.equal(got_y, y)


@pytest.mark.integration
def test_replay_refuses_to_send_a_text_stream_as_events(redis_db) -> None:
    text = ReplayChunk(1, {"tokens": torch.arange(10, dtype=torch.int32)})
    with pytest.raises(ValueError, match="labeled"):
        replay(
            [text],
            RedisStreamPublisher(redis_db, "alma.text"),
            "ptb",
            progress=False,
            wire=RecordFormat(events=EventFormat()),
        )
    assert redis_db.xlen("alma.text") == 0


@pytest.fixture
def tabular_npz(tmp_path):
    g = np.random.default_rng(0)
    x, y = (g.random((12, 2)) * 100).astype(np.float32), g.integers(0, 3, 12)
    np.savez(tmp_path / "train.npz", x=x, y=y)
    return tmp_path / "train.npz", x, y


def alma_replay(redis_server, npz, *args: str) -> int:
    """``alma replay --npz`` into the test Redis (the embedded transport, on a server the test started)."""
    args = build_parser().parse_args(
        [
            "replay",
            "--npz",
            str(npz),
            "--megabatches",
            "3",
            "--topic",
            "alma.tabular",
            "--stream",
            "tabular",
            "--no-progress",
            *("--set", "kafka.transport=redis", "--set", f"redis.url={redis_server.url}"),
            *("--set", "dataset.input_shape=[2]", "--set", "dataset.num_classes=3"),
            *args,
        ]
    )
    return args.func(args)


@pytest.mark.integration
def test_alma_replay_events_publishes_named_feature_events_to_the_redis_stream(
    redis_server, redis_db, tabular_npz, capsys
) -> None:
    npz, x, y = tabular_npz
    code = alma_replay(
        redis_server,
        npz,
        "--events",
        "--events-per-record",
        "2",
        "--set",
        "stream.features=[age, income]",
        "--set",
        "stream.chunk_examples=4",
    )
    assert code == 0
    assert "6 record(s)" in capsys.readouterr().out  # 3 chunks of 4 examples, 2 per record
    first = decode_entry(redis_db.xrange("alma.tabular", count=1)[0][1])
    assert set(json.loads(first[1])) == {"age", "income", "y"}
    keys, got_x, got_y = stream_events(redis_db, "alma.tabular", TABULAR, FEATURES)
    # The replay partitions the examples into chunks in a seeded order: compare as sets of rows.
    sent = sorted(zip(x.tolist(), y.tolist()))
    assert sorted(zip(got_x.tolist(), got_y.tolist())) == sent and keys == [None] * 6


@pytest.mark.integration
def test_alma_replay_events_as_safetensors_rows(redis_server, redis_db, tabular_npz) -> None:
    npz, x, _ = tabular_npz
    assert alma_replay(redis_server, npz, "--events", "--events-format", "rows", "--events-per-record", "4") == 0
    _, got_x, _ = stream_events(redis_db, "alma.tabular", TABULAR)
    assert redis_db.xlen("alma.tabular") == 3 and got_x.dtype == torch.float32
    assert sorted(got_x.tolist()) == sorted(x.tolist())


@pytest.mark.integration
def test_event_options_without_events_are_an_error(redis_server, redis_db, tabular_npz) -> None:
    npz, _, _ = tabular_npz
    with pytest.raises(ValueError, match="--events"):
        alma_replay(redis_server, npz, "--events-format", "rows")
    assert redis_db.xlen("alma.tabular") == 0


_topics = itertools.count()


@pytest.mark.integration
def test_kafka_event_records_have_no_key_and_spread_over_partitions(kafka_broker) -> None:
    from kafka import KafkaConsumer, TopicPartition

    from alma_daemon.transports.kafka import KafkaPublisher

    topic = f"events-{next(_topics)}"
    x, y = digits(40)
    publisher = KafkaPublisher(kafka_broker.bootstrap_servers, topic, partitions=2)
    replay(chunks_of(x, y, 20), publisher, "mnist", progress=False, wire=RecordFormat(events=EventFormat()))

    consumer = KafkaConsumer(bootstrap_servers=kafka_broker.bootstrap_servers, auto_offset_reset="earliest")
    try:
        partitions = [TopicPartition(topic, p) for p in (0, 1)]
        consumer.assign(partitions)
        received: dict[int, list] = {0: [], 1: []}
        deadline = time.monotonic() + 30
        while sum(map(len, received.values())) < 40 and time.monotonic() < deadline:
            for tp, messages in consumer.poll(timeout_ms=500).items():
                received[tp.partition].extend(messages)
    finally:
        consumer.close()
    messages = received[0] + received[1]
    assert len(messages) == 40 and all(received.values()), {p: len(m) for p, m in received.items()}
    assert all(m.key is None for m in messages)
    decoded = [decode_event(m.value, m.headers, MNIST) for m in messages]
    assert sorted(int(y) for _, y in decoded) == sorted(y.tolist())
