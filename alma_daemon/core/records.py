"""Typed records of the engine's work: a :class:`StageRecord` per training stage, a :class:`StepRecord`
per chunk, and their rows in the results files.

A record's row is what ``results.json``, ``series.csv`` and the daemon's series in Redis hold: flat
keys, the measured ones named after the learner's measure (``test_error``, ``val_error`` and the
CER ``cumulative_error`` for a classifier; ``test_perplexity``, ``val_perplexity`` for a language
model). The row format is the one results files have always had, so :meth:`StepRecord.from_row`
reads the files of earlier versions too. Only this module builds row keys from the measure's name.
Observers read the records' typed fields; :meth:`StepRecord.as_row` gives the row.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any

from alma_daemon.learners.growth_report import GrowthReport

#: Stage keys that a step's row repeats when the step trained, in row order (``val_<measure>`` comes
#: between ``steps`` and ``train_flops_per_example``; ``growth`` last, only for a growth stage).
_STAGE_KEYS_IN_STEP = ("stage", "kind", "epochs", "best_epoch", "steps")


@dataclass(frozen=True)
class StageRecord:
    """One training stage: what it trained on, what it cost, and the model it left."""

    stage: int
    #: "finetune", "grow" or "scratch".
    kind: str
    #: The learner's measure ("error" or "perplexity"): :attr:`val` is in its units.
    measure: str
    #: The trained model's measure on the stage's validation data.
    val: float
    train_flops: int
    train_seconds: float
    steps: int
    epochs: int
    best_epoch: int
    model_version: int
    parameters: int
    train_flops_per_example: float
    #: What the growth step did, when the stage started with one.
    growth: GrowthReport | None = None
    #: ``chunks``: the chunks not trained on before (pending) only, even with ``stream.replay``, where
    #: the stage also trains on every earlier chunk kept. ``examples``: the examples trained and
    #: validated on, the pending chunks' without replay, every kept chunk's with it. None for a stage
    #: read back from a step's row, which does not carry them.
    chunks: list[int] | None = None
    examples: int | None = None

    def as_row(self) -> dict[str, Any]:
        """The stage as logs and checkpoint metrics show it."""
        return {
            "stage": self.stage,
            "kind": self.kind,
            "chunks": self.chunks,
            "examples": self.examples,
            "train_flops": self.train_flops,
            "train_seconds": self.train_seconds,
            "steps": self.steps,
            "epochs": self.epochs,
            "best_epoch": self.best_epoch,
            f"val_{self.measure}": self.val,
            "growth": self.growth.as_row() if self.growth is not None else None,
            "model_version": self.model_version,
            "parameters": self.parameters,
            "train_flops_per_example": self.train_flops_per_example,
        }

    def checkpoint_metrics(self) -> dict[str, Any]:
        """What a checkpoint's metrics.json holds about the stage that wrote it (all but the growth report)."""
        return {k: v for k, v in self.as_row().items() if k != "growth"}


@dataclass(frozen=True)
class StepRecord:
    """One chunk's step: the measures taken, the policy's decision, the running totals, and the stage
    it trained (None when the policy waited)."""

    #: Chunks seen so far (1 for the first chunk).
    t: int
    #: The chunk's id.
    chunk: int
    examples_seen: int
    #: The policy's action and its reason.
    decision: str
    reason: str
    #: The learner's measure ("error" or "perplexity"), the unit of the measured fields below.
    measure: str
    #: The model after this step on the test set (None without a test set).
    test: float | None
    #: The model before training on the chunk, measured on the chunk (prequential), and the running sum.
    prequential: float
    cumulative_prequential: float
    #: The CER so far (sum of the test errors, paper Eq. 1): classifiers only, None without a test set.
    cumulative_error: float | None
    train_flops: int
    cumulative_train_flops: int
    parameters: int
    cumulative_parameters: int
    inference_flops_per_example: float
    train_seconds: float
    cumulative_train_seconds: float
    model_version: int
    wall_seconds: float
    stage: StageRecord | None = None
    #: The chunk completed after a later chunk was taken (service/reorder.py): it trained as this step.
    late: bool = False

    @property
    def trained(self) -> bool:
        return self.stage is not None

    def measured(self, measure: str, on: str = "test") -> float | None:
        """The value of ``measure`` on ``on`` ("test" or "prequential"); None when the learner reports
        another measure, or when nothing was measured (no test set)."""
        if measure != self.measure:
            return None
        return {"test": self.test, "prequential": self.prequential}[on]

    def as_row(self) -> dict[str, Any]:
        """The step as results files and the daemon's series hold it."""
        m = self.measure
        row: dict[str, Any] = {
            "t": self.t,
            "chunk": self.chunk,
            "examples_seen": self.examples_seen,
            "trained": self.trained,
            "decision": self.decision,
            "reason": self.reason,
            f"test_{m}": self.test,
            f"prequential_{m}": self.prequential,
            f"cumulative_prequential_{m}": self.cumulative_prequential,
            "train_flops": self.train_flops,
            "cumulative_train_flops": self.cumulative_train_flops,
            "parameters": self.parameters,
            "cumulative_parameters": self.cumulative_parameters,
            "inference_flops_per_example": self.inference_flops_per_example,
            "train_seconds": self.train_seconds,
            "cumulative_train_seconds": self.cumulative_train_seconds,
            "model_version": self.model_version,
            "wall_seconds": self.wall_seconds,
        }
        if m == "error":
            row["cumulative_error"] = self.cumulative_error
        if self.late:  # in-order steps, every simulated one included, keep their rows as they were
            row["late"] = True
        stage = self.stage
        if stage is not None:
            row.update({key: getattr(stage, key) for key in _STAGE_KEYS_IN_STEP})
            row[f"val_{m}"] = stage.val
            row["train_flops_per_example"] = stage.train_flops_per_example
            if stage.growth is not None:
                row["growth"] = stage.growth.as_row()
        return row

    @classmethod
    def from_row(cls, row: Mapping[str, Any]) -> StepRecord:
        """The record of a row from a results file or the daemon's series (this version's or older)."""
        measures = [key.removeprefix("prequential_") for key in row if key.startswith("prequential_")]
        if len(measures) != 1:
            raise ValueError(f"not a step record (needs one prequential_<measure> key): {_describe(row)}")
        m = measures[0]
        try:
            stage = None
            if row.get("stage") is not None:
                stage = StageRecord(
                    stage=row["stage"],
                    kind=row["kind"],
                    measure=m,
                    val=row[f"val_{m}"],
                    train_flops=row["train_flops"],
                    train_seconds=row["train_seconds"],
                    steps=row["steps"],
                    epochs=row["epochs"],
                    best_epoch=row["best_epoch"],
                    model_version=row["model_version"],
                    parameters=row["parameters"],
                    train_flops_per_example=row["train_flops_per_example"],
                    growth=GrowthReport.from_row(row["growth"]) if row.get("growth") is not None else None,
                )
            return cls(
                t=row["t"],
                chunk=row["chunk"],
                examples_seen=row["examples_seen"],
                decision=row["decision"],
                reason=row["reason"],
                measure=m,
                test=row[f"test_{m}"],
                prequential=row[f"prequential_{m}"],
                cumulative_prequential=row[f"cumulative_prequential_{m}"],
                cumulative_error=row.get("cumulative_error"),
                train_flops=row["train_flops"],
                cumulative_train_flops=row["cumulative_train_flops"],
                parameters=row["parameters"],
                cumulative_parameters=row["cumulative_parameters"],
                inference_flops_per_example=row["inference_flops_per_example"],
                train_seconds=row["train_seconds"],
                cumulative_train_seconds=row["cumulative_train_seconds"],
                model_version=row["model_version"],
                wall_seconds=row["wall_seconds"],
                stage=stage,
                late=bool(row.get("late", False)),
            )
        except KeyError as missing:
            raise ValueError(f"step record without key {missing}: {_describe(row)}") from None


#: The step record's fields that hold wall-clock times: two runs of one stream, interrupted or not, on
#: one process or several, may differ in these and in nothing else.
TIMING_FIELDS = frozenset(f.name for f in fields(StepRecord) if f.name.endswith("seconds"))


def timeless(row: Mapping[str, Any]) -> dict[str, Any]:
    """``row`` without its :data:`TIMING_FIELDS`: what must be equal between runs of one stream."""
    return {key: value for key, value in row.items() if key not in TIMING_FIELDS}


def read_rows(rows: list[dict]) -> list[StepRecord]:
    """The records of a series of rows."""
    return [StepRecord.from_row(row) for row in rows]


def _describe(row: Mapping[str, Any]) -> str:
    return f"chunk {row['chunk']}" if "chunk" in row else f"keys {sorted(row)}"
