"""Typed records of the engine's work: a :class:`StageRecord` per training stage, a :class:`StepRecord`
per chunk, and their rows in the results files.

A record's row is what ``results.json``, ``series.csv`` and the daemon's series in Redis hold: flat
keys, the measured ones named after the task's measure (``test_error``, ``val_error`` and the
CER ``cumulative_error`` for the paper's classifiers; ``test_recall`` and ``cumulative_recall`` for a
task judged by recall; ``test_perplexity``, ``val_perplexity`` for a language model). Each field declares its place in the row with :func:`column` (or :func:`no_column`), so the
rows, their reading back and the CSV columns all follow the dataclasses' fields, in field order.
Only this module builds row keys from the measure's name. Observers read the records' typed fields;
:meth:`StepRecord.as_row` gives the row.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from dataclasses import MISSING, Field, dataclass, field, fields, replace
from typing import Any

from alma_daemon.learners.growth_report import GrowthReport
from alma_daemon.registry import MEASURES as ALL_MEASURES

#: The measures whose columns every series.csv has, in this order; a run of another measure adds its own.
MEASURES = ("error", "perplexity")
#: The measures with a cumulative sum over the stream (the CER and its kin): all but a perplexity.
CUMULATIVE_MEASURES = tuple(name for name in ALL_MEASURES if name != "perplexity")


@dataclass(frozen=True)
class Column:
    """How a record's field appears in its row."""

    #: The row's key; ``{measure}`` stands for the record's measure.
    key: str
    #: The measures whose records carry the key (None: every record).
    measures: tuple[str, ...] | None = None
    #: The row carries the key only when the field is true (a flag kept out of ordinary rows).
    only_if_true: bool = False
    #: The row carries the key only when the field is not None.
    only_if_set: bool = False
    #: A column of series.csv.
    csv: bool = False
    #: A stage field that a trained step's row repeats (None values left out).
    in_step: bool = False
    #: Field value -> row value, and back; as is when None.
    encode: Callable[[Any], Any] | None = None
    decode: Callable[[Any], Any] | None = None

    @property
    def measured(self) -> bool:
        return "{measure}" in self.key or self.measures is not None

    def key_for(self, measure: str) -> str:
        return self.key.format(measure=measure)

    def applies_to(self, measure: str) -> bool:
        return self.measures is None or measure in self.measures


def column(key: str | None = None, *, default: Any = MISSING, **how: Any) -> Any:
    """A field with its place in the row (``key``: the field's name unless given); see :class:`Column`."""
    return field(default=default, metadata={"column": Column(key or "", **how)})


def no_column(**kwargs: Any) -> Any:
    """A field that no row holds under a key of its own."""
    return field(metadata={"column": None}, **kwargs)


def columns_of(record_type: type) -> Iterator[tuple[Field[Any], Column]]:
    """The fields of a record type that rows hold, in field order, with their columns."""
    for f in fields(record_type):
        how = f.metadata.get("column")
        if how is not None:
            yield f, (how if how.key else replace(how, key=f.name))


def _encoded(how: Column, value: Any) -> Any:
    return how.encode(value) if how.encode is not None and value is not None else value


def _decoded(how: Column, value: Any) -> Any:
    return how.decode(value) if how.decode is not None and value is not None else value


@dataclass(frozen=True, kw_only=True)
class StageRecord:
    """One training stage: what it trained on, what it cost, and the model it left."""

    stage: int = column(in_step=True)
    #: "finetune", "grow", "scratch" (a network from fresh weights kept) or "linear" (a linear model from fresh
    #: weights kept: ``train.linear_candidate``).
    kind: str = column(in_step=True)
    epochs: int = column(in_step=True)
    best_epoch: int = column(in_step=True)
    steps: int = column(in_step=True)
    #: The trained model's measure on the stage's validation data, in :attr:`measure`'s units.
    val: float = column("val_{measure}", in_step=True)
    train_flops_per_example: float = column(in_step=True)
    #: What the growth step did, when the stage started with one.
    growth: GrowthReport | None = column(
        default=None, in_step=True, encode=GrowthReport.as_row, decode=GrowthReport.from_row
    )
    #: ``chunks``: the chunks not trained on before (pending) that the stage trained on, even with
    #: ``stream.replay``, where the stage also trains on chunks kept for replay. ``examples``: the
    #: examples trained and validated on, the pending chunks' and (with replay) the replayed ones', at
    #: most ``train.max_stage_examples``. ``skipped``: the pending chunks that cap dropped untrained
    #: (None when it dropped none). None for a stage read back from a step's row, which does not carry them.
    chunks: list[int] | None = column(default=None)
    examples: int | None = column(default=None)
    skipped: list[int] | None = column(default=None)
    #: A binary task's decision for the version: the positive class's calibrated probability from which
    #: it is served (``task.decision``; None: the most probable class).
    threshold: float | None = column(default=None, in_step=True, only_if_set=True)
    #: True where the stream had changed and the stage restarted the replay and validation sets from its new
    #: chunks, training on them alone (``stream.reservoir_reset``); None elsewhere.
    restarted: bool | None = column(default=None, in_step=True, only_if_set=True)
    train_flops: int = column()
    train_seconds: float = column()
    model_version: int = column()
    parameters: int = column()
    #: The task's measure (alma_daemon/measures).
    measure: str = no_column()

    def as_row(self) -> dict[str, Any]:
        """The stage as logs and checkpoint metrics show it."""
        return {how.key_for(self.measure): _encoded(how, getattr(self, f.name)) for f, how in columns_of(StageRecord)}

    def step_columns(self) -> dict[str, Any]:
        """The stage's keys in the row of the step that trained it (those it has a value for)."""
        row = {}
        for f, how in columns_of(StageRecord):
            value = getattr(self, f.name)
            if how.in_step and value is not None:
                row[how.key_for(self.measure)] = _encoded(how, value)
        return row

    def checkpoint_metrics(self) -> dict[str, Any]:
        """What a checkpoint's metrics.json holds about the stage that wrote it (all but the growth report)."""
        return {k: v for k, v in self.as_row().items() if k != "growth"}

    @classmethod
    def from_step_row(cls, row: Mapping[str, Any], measure: str) -> StageRecord:
        """The stage of a trained step's row: its own keys, and those it shares with the step (its
        FLOPs, seconds, parameters and model version); what only a stage's own row holds is None."""
        values: dict[str, Any] = {"measure": measure}
        for f, how in columns_of(cls):
            key = how.key_for(measure)
            if f.default is MISSING:
                values[f.name] = _decoded(how, row[key])
            elif how.in_step:
                values[f.name] = _decoded(how, row.get(key))
        return cls(**values)


@dataclass(frozen=True, kw_only=True)
class StepRecord:
    """One chunk's step: the measures taken, the policy's decision, the running totals, and the stage
    it trained (None when the policy waited)."""

    #: Chunks seen so far (1 for the first chunk).
    t: int = column(csv=True)
    #: The chunk's id.
    chunk: int = column(csv=True)
    examples_seen: int = column(csv=True)
    #: The chunk's time in the history it replays: its newest row's ``dataset.time_column`` (ISO 8601
    #: text in UTC for date-times, the number as written for numbers). Only a simulated table with a time
    #: column has it: other streams', the daemon's (its records carry no time) and older rows have no key.
    chunk_time: str | float | None = column(default=None, only_if_set=True, csv=True)
    #: Whether the step trained a stage (set from :attr:`stage`).
    trained: bool = field(init=False, metadata={"column": Column("trained", csv=True)})
    #: The policy's action and its reason.
    decision: str = column(csv=True)
    reason: str = column()
    #: The model after this step on the test set (None without a test set).
    test: float | None = column("test_{measure}", csv=True)
    #: The model before training on the chunk, measured on the chunk (prequential), and the running sum.
    prequential: float = column("prequential_{measure}", csv=True)
    cumulative_prequential: float = column("cumulative_prequential_{measure}")
    #: The mean prequential measure over the last stream.prequential_window chunks (this one included):
    #: the measure users saw lately, which on an endless stream judges a policy where a sum cannot.
    prequential_window: float | None = column("prequential_window_{measure}", default=None, only_if_set=True, csv=True)
    #: The model's age after the step: chunks arrived and seconds passed since the last stage (0 chunks
    #: on a step that trained), bounded by policy.max_model_age_chunks / max_model_age_seconds. The three
    #: are None in rows written before they were recorded.
    model_age_chunks: int | None = column(default=None, only_if_set=True, csv=True)
    model_age_seconds: float | None = column(default=None, only_if_set=True)
    train_flops: int = column(csv=True)
    cumulative_train_flops: int = column(csv=True)
    parameters: int = column(csv=True)
    cumulative_parameters: int = column(csv=True)
    inference_flops_per_example: float = column(csv=True)
    train_seconds: float = column(csv=True)
    cumulative_train_seconds: float = column()
    model_version: int = column(csv=True)
    wall_seconds: float = column(csv=True)
    #: The cumulative measure so far: the sum of the test measures (with the error rate, the CER of the
    #: paper's Eq. 1); not for perplexities, None without a test set.
    cumulative: float | None = column("cumulative_{measure}", measures=CUMULATIVE_MEASURES, csv=True)
    #: The task's other measures (:meth:`alma_daemon.measures.Measure.details`) on the test set and on
    #: the chunk; rows of a task that has none (the paper's) have no such keys.
    test_measures: dict[str, float | None] | None = column(default=None, only_if_true=True)
    prequential_measures: dict[str, float | None] | None = column(default=None, only_if_true=True)
    #: A binary task's reliability on the chunk's prequential sample (the probabilities users were served,
    #: before the model trained on them): per bin of the positive class's probability between
    #: :data:`~alma_daemon.measures.decision.RELIABILITY_EDGES`, [examples, sum of the probabilities,
    #: positives]. None for other tasks and in rows written before it was recorded.
    reliability: list[list[float]] | None = column(default=None, only_if_set=True)
    #: The measure of an input-blind model (the majority class, the mean target) on the test set, else
    #: on the chunk: what the model must beat. Recorded for the tasks of a team (a measure, a binary or
    #: a regression task), not for the paper's.
    baseline: float | None = column("baseline_{measure}", default=None, only_if_set=True)
    #: The reference learner (reference.kind: a linear model learnt on the same stream, core/reference.py):
    #: its prequential measure on the chunk's sample the network's is taken on, before it learns the chunk;
    #: the running sum; the mean over the last stream.prequential_window chunks. None without a reference
    #: (images, text, reference.kind none) and in rows written before there was one.
    reference: float | None = column(
        "reference_{measure}", default=None, only_if_set=True, csv=True, measures=CUMULATIVE_MEASURES
    )
    cumulative_reference: float | None = column("cumulative_reference_{measure}", default=None, only_if_set=True)
    reference_window: float | None = column("reference_window_{measure}", default=None, only_if_set=True)
    #: The chunk completed after a later chunk was taken (service/reorder.py): it trained as this step.
    #: Only such a step's row has the key, so in-order rows, every simulated one, have no ``late``.
    late: bool = column(default=False, only_if_true=True)
    #: The stage trained, whose :meth:`StageRecord.step_columns` end the row.
    stage: StageRecord | None = no_column(default=None)
    #: The task's measure (alma_daemon/measures), the unit of the measured fields.
    measure: str = no_column()

    def __post_init__(self) -> None:
        object.__setattr__(self, "trained", self.stage is not None)

    def measured(self, measure: str, on: str = "test") -> float | None:
        """The value of ``measure`` on ``on`` ("test" or "prequential"); None when the learner reports
        another measure, or when nothing was measured (no test set)."""
        if measure != self.measure:
            return None
        return {"test": self.test, "prequential": self.prequential}[on]

    def as_row(self) -> dict[str, Any]:
        """The step as results files and the daemon's series hold it."""
        row: dict[str, Any] = {}
        for f, how in columns_of(StepRecord):
            value = getattr(self, f.name)
            if how.only_if_set and value is None:
                continue
            if how.applies_to(self.measure) and (value or not how.only_if_true):
                row[how.key_for(self.measure)] = value
        if self.stage is not None:
            row.update(self.stage.step_columns())
        return row

    @classmethod
    def from_row(cls, row: Mapping[str, Any]) -> StepRecord:
        """The record of a row from a results file or the daemon's series (this version's or older)."""
        measures = [m for key in row if (m := key.removeprefix("prequential_")) != key and m in ALL_MEASURES]
        if len(measures) != 1:
            raise ValueError(f"not a step record (needs one prequential_<measure> key): {_describe(row)}")
        m = measures[0]
        values: dict[str, Any] = {"measure": m}
        try:
            for f, how in columns_of(cls):
                if not f.init:
                    continue
                key = how.key_for(m)
                required = f.default is MISSING and how.applies_to(m) and how.measures is None
                values[f.name] = row[key] if required else row.get(key, None if f.default is MISSING else f.default)
            values["stage"] = StageRecord.from_step_row(row, m) if row.get("stage") is not None else None
            return cls(**values)
        except KeyError as missing:
            raise ValueError(f"step record without key {missing}: {_describe(row)}") from None


def csv_columns(measure: str = "error") -> list[str]:
    """The columns of series.csv: the step's CSV fields in field order, the measured ones as one block
    (each of :data:`MEASURES` in turn, then ``measure``'s where it is another) where the first of them stands."""
    columns: list[str | None] = []
    measured: list[Column] = []
    for _, how in columns_of(StepRecord):
        if not how.csv:
            continue
        if how.measured:
            if not measured:
                columns.append(None)
            measured.append(how)
        else:
            columns.append(how.key)
    shown = MEASURES if measure in MEASURES else (*MEASURES, measure)
    block = [how.key_for(m) for m in shown for how in measured if how.applies_to(m)]
    at = columns.index(None)
    return [c for c in columns[:at] if c] + block + [c for c in columns[at + 1 :] if c]


#: The step record's fields that hold wall-clock times: two runs of one stream, interrupted or not, on
#: one process or several, may differ in these and in nothing else.
TIMING_FIELDS = frozenset(f.name for f in fields(StepRecord) if f.name.endswith("seconds"))
#: The step record's fields that one front door fills and the other cannot: a simulated history's chunks
#: carry their time, the wire's records none, so the daemon replaying a table has no ``chunk_time``.
SOURCE_FIELDS = frozenset({"chunk_time"})


def timeless(row: Mapping[str, Any]) -> dict[str, Any]:
    """``row`` without its :data:`TIMING_FIELDS` and :data:`SOURCE_FIELDS`: what must be equal between
    runs of one stream, simulated or served."""
    return {key: value for key, value in row.items() if key not in TIMING_FIELDS | SOURCE_FIELDS}


def read_rows(rows: list[dict[str, Any]]) -> list[StepRecord]:
    """The records of a series of rows."""
    return [StepRecord.from_row(row) for row in rows]


def _describe(row: Mapping[str, Any]) -> str:
    return f"chunk {row['chunk']}" if "chunk" in row else f"keys {sorted(row)}"
