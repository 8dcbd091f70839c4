"""``alma simulate``: replay a dataset as a stream of chunks through the engine, in process."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from alma_daemon.config import Config, ConfigError, to_dict
from alma_daemon.core.assembly import assemble_engine
from alma_daemon.core.checkpoints import CheckpointStore
from alma_daemon.core.chunk_buffer import MemoryBuffer
from alma_daemon.core.engine import Engine, EngineObserver
from alma_daemon.data.arrays import load_npz
from alma_daemon.data.datasets import TaskInfo, load_dataset
from alma_daemon.data.river_streams import read_configured_river
from alma_daemon.data.stream_task import arrays_task, select_test_examples
from alma_daemon.data.streams import Chunk, build_drift, drifted, megabatch_stream, ordered_stream
from alma_daemon.data.table import read_table
from alma_daemon.data.task_terms import configured_task
from alma_daemon.data.tensors import LabeledData
from alma_daemon.data.text import text_stream
from alma_daemon.observability.progress import ProgressBar
from alma_daemon.observability.results import ResultsWriter, results_of


@dataclass
class SimulatedStream:
    """A dataset replayed as a stream: its task, its chunks in order, the common test set."""

    task: TaskInfo
    chunks: Iterator[Chunk]
    test: LabeledData | None
    length: int
    #: What reading the data left out, for the results' summary (a table's ``rows_dropped``, ``text_columns``).
    notes: dict[str, Any] = dataclasses.field(default_factory=dict)


def simulated_stream(config: Config) -> SimulatedStream:
    """The paper's stream for ``config.dataset``, built by the stream kind of that dataset."""
    stream = STREAM_KINDS.get(config.dataset.name, labeled_stream)(config)
    stream.task = configured_task(stream.task, config)
    return stream


def labeled_stream(config: Config) -> SimulatedStream:
    """Labeled examples (images): a seeded random partition into B equal mega-batches, drifting from
    ``stream.drift.at`` on when asked (the engine drifts the test set alike)."""
    dataset = load_dataset(config.dataset.name, config.dataset.root)
    test = select_test_examples(dataset.test, config)
    chunks = megabatch_stream(
        dataset.train, config.stream.megabatches, config.stream.seed, limit=config.stream.train_examples
    )
    drift = build_drift(config.stream.drift, dataset.task, config.stream.seed)
    return SimulatedStream(dataset.task, drifted(chunks, drift), test, config.stream.megabatches)


def contiguous_text_stream(config: Config) -> SimulatedStream:
    """A corpus cut into B chunks of contiguous text, with one tokenizer for the whole stream."""
    stream = text_stream(config.dataset, config.stream)
    return SimulatedStream(stream.task, iter(stream.chunks), stream.test, len(stream.chunks))


def river_stream(config: Config) -> SimulatedStream:
    """A River stream in River's order, cut into B contiguous chunks (docs/river.md); ``stream.drift``
    applies on top of the stream's own drift, as for any labeled stream."""
    river = read_configured_river(config.dataset, config.stream.seed)
    chunks = ordered_stream(river.train, config.stream.megabatches, limit=config.stream.train_examples)
    drift = build_drift(config.stream.drift, river.task, config.stream.seed)
    test = select_test_examples(river.test, config)
    return SimulatedStream(river.task, drifted(chunks, drift), test, config.stream.megabatches)


def table_stream(config: Config) -> SimulatedStream:
    """A team's history in time order, cut into B contiguous chunks, each with the time of its newest row
    where the history has a time column; its last share (or ``dataset.test_file``) is the test set
    (docs/results.md#backtesting-on-your-own-history)."""
    table = read_table(config)
    chunks = ordered_stream(
        table.train, config.stream.megabatches, limit=config.stream.train_examples, time_of=table.chunk_time
    )
    drift = build_drift(config.stream.drift, table.task, config.stream.seed)
    test = select_test_examples(table.test, config)
    # Equal chunks leave the last rows of the history (fewer than B) to none: counted, not lost in silence.
    streamed = (
        len(table.train)
        if config.stream.train_examples is None
        else min(config.stream.train_examples, len(table.train))
    )
    notes = table.notes() | {"rows_in_no_chunk": streamed % config.stream.megabatches}
    return SimulatedStream(table.task, drifted(chunks, drift), test, config.stream.megabatches, notes)


def arrays_stream(config: Config) -> SimulatedStream:
    """A team's arrays (``dataset.files``, .npz with x and y) partitioned into B chunks as ``alma replay
    --npz`` partitions them, measured on ``dataset.test_file`` as the daemon is."""
    if not config.dataset.files:
        raise ConfigError(
            "dataset.files: alma simulate with dataset.name=arrays needs the training arrays (.npz with x, y); "
            "for a time-ordered history from .csv, .parquet or .npz use dataset.name: table"
        )
    read = arrays_task(config)
    train = LabeledData.concat([load_npz(name, read.task.regression) for name in config.dataset.files])
    chunks = megabatch_stream(train, config.stream.megabatches, config.stream.seed, limit=config.stream.train_examples)
    drift = build_drift(config.stream.drift, read.task, config.stream.seed)
    return SimulatedStream(read.task, drifted(chunks, drift), read.test, config.stream.megabatches)


#: Datasets whose stream is not a random partition of a registered dataset's labeled examples, by name.
STREAM_KINDS: dict[str, Callable[[Config], SimulatedStream]] = {
    "ptb": contiguous_text_stream,
    "text": contiguous_text_stream,
    "river": river_stream,
    "arrays": arrays_stream,
    "table": table_stream,
}


def replayed(config: Config) -> Config:
    """``config`` as a simulation runs it: without the freshness bound in seconds. A replayed stream
    has no arrival times, and its clock is how fast this machine trains, so that bound would make a
    run's series depend on the hardware; the bound in chunks applies as in the service."""
    if config.policy.max_model_age_seconds is None:
        return config
    return dataclasses.replace(config, policy=dataclasses.replace(config.policy, max_model_age_seconds=None))


def build_engine(
    config: Config, stream: SimulatedStream, observers: list[EngineObserver], checkpoints: CheckpointStore | None = None
) -> Engine:
    """A fresh engine for ``stream`` over an in-memory buffer."""
    return assemble_engine(
        replayed(config),
        stream.task,
        MemoryBuffer(),
        test_set=stream.test,
        checkpoints=checkpoints,
        observers=observers,
    )


def run_simulation(
    config: Config,
    out: str | Path | None = None,
    *,
    progress: bool = True,
    observers: Sequence[EngineObserver] | None = None,
    checkpoint_dir: str | Path | None = None,
) -> dict[str, Any]:
    """Run a whole simulated stream and return the results (also written to ``out`` when given)."""
    config = replayed(config)
    config.policy.check_stream_length(config.stream.megabatches)
    stream = simulated_stream(config)
    bar = ProgressBar(stream.length, enabled=progress)
    writer = ResultsWriter(out, to_dict(config), notes=stream.notes) if out is not None else None
    checkpoints = CheckpointStore(checkpoint_dir, config.serving.model_name) if checkpoint_dir else None
    # The results writer first: the caller's observers may read the results file of the step.
    every = [writer, *(observers or []), bar]
    engine = build_engine(config, stream, [o for o in every if o is not None], checkpoints)
    try:
        for chunk in stream.chunks:
            engine.on_chunk(chunk)
    finally:
        bar.close()
    engine.say_unfilled_pool()
    return writer.write(engine) if writer else results_of(engine, to_dict(config), notes=stream.notes)
