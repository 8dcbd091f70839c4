"""The engine's state between chunks, apart from the engine: the daemon's store of it (and ``alma
status``, which reads it) need no torch."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any


@dataclass
class EngineState:
    """Everything the engine needs to continue a stream; JSON-able, persisted by the daemon (engine_store.py)."""

    chunks_seen: int = 0
    #: The newest chunk id taken; a chunk with a lower id is late (it completed after a later one was taken).
    last_chunk: int = 0
    late_chunks: int = 0
    examples_seen: int = 0
    stages_done: int = 0
    model_version: int = 0
    #: The cumulative measure: the sum of the test measures (the CER with the error rate).
    cumulative_error: float = 0.0
    cumulative_prequential: float = 0.0
    cumulative_train_flops: int = 0
    cumulative_parameters: int = 0
    cumulative_train_seconds: float = 0.0
    started_at: float = field(default_factory=time.time)
    #: Cost of the last training stage per training example, for budget-aware policies.
    last_stage_flops_per_example: float | None = None
    last_stage_seconds_per_example: float | None = None
    last_decision: dict[str, Any] = field(default_factory=dict)
    #: chunks_seen and the time when the last stage ended: the model's age counts from them (from 0 and
    #: started_at before the first stage).
    last_stage_chunks_seen: int = 0
    last_stage_at: float | None = None
    #: The prequential measures of the newest chunks (stream.prequential_window of them), for the windowed measure.
    recent_prequential: list[float] = field(default_factory=list)
    #: The reference learner (reference.kind, core/reference.py): its state as JSON (None: no reference, or a
    #: state written before there was one), the sum of its prequential measures and its newest ones.
    reference: dict[str, Any] | None = None
    cumulative_reference: float = 0.0
    recent_reference: list[float] = field(default_factory=list)
    #: The steps' records as rows (:meth:`StepRecord.as_row`), the form results files and Redis hold.
    series: list[dict[str, Any]] = field(default_factory=list)
