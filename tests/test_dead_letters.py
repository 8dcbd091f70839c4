"""Dead letters keep what a team needs to mend a record and send it again: its bytes, and a reason
naming the field at fault (docs/service.md, "Bad input")."""

from __future__ import annotations

import json
from typing import Any

import safetensors.torch
import torch

from alma_daemon.data.events import EVENT_JSON, decode_event
from alma_daemon.data.wire import StreamSchema
from alma_daemon.infra.redis_keys import StreamKeys
from alma_daemon.service.ingest.cutter import EventCollector, EventCutter
from alma_daemon.service.ingest.store import IngestStore
from alma_daemon.service.redis_tx import DEAD_LETTER_RECORD_BYTES, dead_letter
from alma_daemon.transports.redis_stream import decode_entry
from alma_daemon.transports.source import SourceRecord

KEYS = StreamKeys("fraud")
FEATURES = ("amount", "age")
SCHEMA = StreamSchema("labeled", (2,), num_classes=2, pixel_range=False, classes=("ok", "fraud"))
JSON_HEADERS = [("content-type", EVENT_JSON.encode()), ("traceparent", b"00-\xff")]


class RecordingPipe:
    """Stands in for a MULTI/EXEC pipeline: records the dead-letter entries queued on it."""

    def __init__(self) -> None:
        self.entries: list[dict[str, Any]] = []

    def xadd(self, name: str, fields: dict[str, Any], **_: Any) -> None:
        assert name == KEYS.dead
        self.entries.append(fields)

    def __getattr__(self, command: str) -> Any:
        return lambda *args, **kwargs: None  # the batch's other writes (parts, counters, offsets)


def source_record(value: bytes, offset: int = 0, key: bytes | None = b"card-42") -> SourceRecord:
    return SourceRecord("0", str(offset + 1), key, value, list(JSON_HEADERS), f"alma.fraud/0@{offset}")


def dead_letters_of(records: list[SourceRecord]) -> list[dict[str, Any]]:
    """The dead-letter entries ingest writes for ``records`` (an event stream's poll)."""
    batch = EventCollector(EventCutter(chunk_examples=100, chunk_seconds=None), SCHEMA, FEATURES).collect(records)
    pipe = RecordingPipe()
    store = IngestStore.__new__(IngestStore)  # no Redis: only the dead letters it queues are looked at
    store.keys = KEYS
    store._stage(pipe, batch)
    return pipe.entries


def test_a_string_features_dead_letter_names_the_field_and_keeps_the_record_to_send_again() -> None:
    bad = json.dumps({"amount": "12.50", "age": 31, "y": "fraud"}).encode()
    [entry] = dead_letters_of([source_record(b'{"amount": 3.5, "age": 40, "y": "ok"}'), source_record(bad, 1)])
    assert entry["reason"] == "dtype" and "field 'amount' is \"12.50\"" in entry["detail"]
    assert entry["origin"] == "alma.fraud/0@1" and entry["value_bytes"] == len(bad)
    assert entry["value"] == bad and entry["key"] == b"card-42"

    # What the entry holds is the record as sent: mended, it is taken.
    key, value, headers, problem = decode_entry({k.encode(): v for k, v in entry.items()})
    assert (key, headers, problem) == (b"card-42", JSON_HEADERS, None)
    mended = value.replace(b'"12.50"', b"12.50")
    x, y = decode_event(mended, headers, SCHEMA, FEATURES)
    assert torch.equal(x, torch.tensor([[12.5, 31.0]])) and torch.equal(y, torch.tensor([1]))


def test_a_record_longer_than_the_bound_keeps_its_size_and_the_start_of_its_key_only() -> None:
    pipe = RecordingPipe()
    value = b"x" * DEAD_LETTER_RECORD_BYTES
    dead_letter(pipe, KEYS, "size", "too long", "alma.fraud/0@9", key=b"k" * 300, value=value, headers=JSON_HEADERS)
    [entry] = pipe.entries
    assert "value" not in entry and "headers" not in entry
    assert entry["value_bytes"] == len(value) and entry["key"] == b"k" * 200

    dead_letter(pipe, KEYS, "size", "fits", "alma.fraud/0@10", key=b"k", value=value[: DEAD_LETTER_RECORD_BYTES // 2])
    assert pipe.entries[-1]["value"] == value[: DEAD_LETTER_RECORD_BYTES // 2] and "headers" not in pipe.entries[-1]


def test_a_record_without_a_value_or_with_unreadable_headers_is_still_dead_lettered() -> None:
    pipe = RecordingPipe()
    dead_letter(pipe, KEYS, "headers", "bad headers", "stream@1-0", value=None, headers=[("content-type",)])
    [entry] = pipe.entries
    assert entry["value_bytes"] == 0 and "value" not in entry and "headers" not in entry and entry["key"] == b""


def test_an_unknown_class_names_dead_letter_says_which_name_and_which_classes() -> None:
    bad = json.dumps({"amount": 3.5, "age": 40, "y": "frod"}).encode()
    [entry] = dead_letters_of([source_record(bad)])
    assert entry["reason"] == "label_range"
    assert entry["detail"] == "label 'frod' is not a class; the classes are ok, fraud"
    assert entry["value"] == bad


def test_an_event_stream_stores_class_names_as_indexes_and_a_regressions_targets_as_float32() -> None:
    named = json.dumps({"amount": [3.5, 7.0], "age": [40, 22], "y": ["ok", "fraud"]}).encode()
    batch = EventCollector(EventCutter(2, None), SCHEMA, FEATURES).collect([source_record(named)])
    assert not batch.rejected and list(batch.completed) == [1]
    assert torch.equal(safetensors.torch.load(batch.segments[0].value)["y"], torch.tensor([0, 1]))

    amounts = StreamSchema("labeled", (2,), pixel_range=False, regression=True)
    targets = json.dumps({"amount": [3.5, 7.0], "age": [40, 22], "y": [12.25, -3]}).encode()
    nan = b'{"amount": 1, "age": 2, "y": NaN}'
    batch = EventCollector(EventCutter(2, None), amounts, FEATURES).collect(
        [source_record(targets), source_record(nan)]
    )
    assert [r.reason for _, r in batch.rejected] == ["non_finite"]
    y = safetensors.torch.load(batch.segments[0].value)["y"]
    assert y.dtype == torch.float32 and torch.equal(y, torch.tensor([12.25, -3.0]))
