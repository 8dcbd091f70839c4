"""The engine's state in Redis: its counters in one JSON value, its per-chunk records in a list.

A step appends its record to the list inside the step's transaction, so each step writes a
constant amount however long the stream has run. Rewriting the whole series every step would make
a stream of n chunks write O(n^2) bytes to Redis and to its append-only file.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any

from alma_daemon.core.engine_state import EngineState
from alma_daemon.infra.redis_keys import StreamKeys


def state_fields(state: EngineState) -> dict[str, Any]:
    """Every field of ``state`` but the series, as JSON-ready data."""
    return {f.name: getattr(state, f.name) for f in dataclasses.fields(state) if f.name != "series"}


def last_record(client: Any, keys: StreamKeys) -> dict[str, Any] | None:
    """The newest committed per-chunk record, without reading the rest of the series."""
    raw = client.lindex(keys.series, -1)
    return json.loads(raw) if raw is not None else None


class EngineStateStore:
    """Loads and saves one stream's :class:`EngineState`; saving is staged on a MULTI pipeline.

    With ``keep_rows``, the series in Redis and in the engine's memory holds the newest ``keep_rows``
    records only, so that neither grows with the stream's age; every record is in the daemon's
    ``series.jsonl`` (observability/results.py).
    """

    def __init__(self, client: Any, keys: StreamKeys, keep_rows: int | None = None):
        self.client = client
        self.keys = keys
        self.keep_rows = keep_rows
        self._saved_records = 0
        self._staged_records = 0
        self._staged: EngineState | None = None

    def load(self) -> EngineState | None:
        """The committed state, its series (the newest ``keep_rows`` records) included; ``None`` before
        the first step."""
        raw = self.client.get(self.keys.engine)
        start = -self.keep_rows if self.keep_rows else 0
        records = [json.loads(r) for r in self.client.lrange(self.keys.series, start, -1)]
        self._saved_records = self._staged_records = len(records)
        if raw is None:
            return None
        return EngineState(**json.loads(raw), series=records)

    def stage_save(self, pipe: Any, state: EngineState) -> None:
        """Queue the counters and the records added since the last commit on ``pipe``."""
        pipe.set(self.keys.engine, json.dumps(state_fields(state)))
        new = state.series[self._saved_records :]
        if new:
            pipe.rpush(self.keys.series, *(json.dumps(record) for record in new))
            if self.keep_rows:
                pipe.ltrim(self.keys.series, -self.keep_rows, -1)
        self._staged_records = len(state.series)
        self._staged = state

    def committed(self) -> None:
        """The pipeline holding the last :meth:`stage_save` has executed: the engine's series is cut to
        what Redis now holds."""
        self._saved_records = self._staged_records
        state = self._staged
        if self.keep_rows and state is not None and len(state.series) > self.keep_rows:
            excess = len(state.series) - self.keep_rows
            del state.series[:excess]
            self._saved_records -= excess
            self._staged_records = self._saved_records
