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


def state_fields(state: EngineState) -> dict:
    """Every field of ``state`` but the series, as JSON-ready data."""
    return {f.name: getattr(state, f.name) for f in dataclasses.fields(state) if f.name != "series"}


def last_record(client: Any, keys: StreamKeys) -> dict | None:
    """The newest committed per-chunk record, without reading the rest of the series."""
    raw = client.lindex(keys.series, -1)
    return json.loads(raw) if raw is not None else None


class EngineStateStore:
    """Loads and saves one stream's :class:`EngineState`; saving is staged on a MULTI pipeline."""

    def __init__(self, client: Any, keys: StreamKeys):
        self.client = client
        self.keys = keys
        self._saved_records = 0
        self._staged_records = 0

    def load(self) -> EngineState | None:
        """The committed state, series included; ``None`` before the first step."""
        raw = self.client.get(self.keys.engine)
        records = [json.loads(r) for r in self.client.lrange(self.keys.series, 0, -1)]
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
        self._staged_records = len(state.series)

    def committed(self) -> None:
        """The pipeline holding the last :meth:`stage_save` has executed."""
        self._saved_records = self._staged_records
