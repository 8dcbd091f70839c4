"""The run pool of ``alma study`` and the benchmarks: many simulated streams, each on one torch
thread, in this process or in worker processes, resumed from what an earlier invocation finished.

A cache says which runs are finished: :class:`RunFolders` when each run writes its own folder
(``alma study``), :class:`RecordFile` when each run returns a compact record kept in one JSON file
(the benchmarks). :func:`resume` splits the runs into those the cache holds and those still to do;
:func:`run_each` runs the latter and puts each result in the cache as it finishes, so a study or a
benchmark stopped at any point loses only the runs in flight. A run that raised is reported and
left out of the cache: the next invocation runs it again. torch is imported only when a run
starts, so a benchmark's parent process (and its ``--report-only``) does without it.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import ProcessPoolExecutor, as_completed
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from alma_daemon.core.atomic_json import write_json_atomic

if TYPE_CHECKING:
    from alma_daemon.config import Config


@dataclass(frozen=True)
class PoolRun:
    """One run: its key in the cache and the call that does it.

    ``function`` is a module-level function, so that a worker process can be handed it."""

    key: str
    function: Callable[..., Any]
    arguments: tuple[Any, ...] = ()


class RunCache(Protocol):
    """Where finished runs are kept, by key."""

    def get(self, key: str) -> Any | None:
        """The finished run's result, or None when it has to run (again)."""

    def put(self, key: str, result: Any) -> None:
        """Keep a run that has just finished."""


class RecordFile:
    """The benchmarks' cache: ``{"runs": {key: record}}`` in one JSON file, rewritten after every run.

    The keys are sorted, so the file changes only where a run was added."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        self.records: dict[str, Any] = json.loads(self.path.read_text())["runs"] if self.path.is_file() else {}

    def get(self, key: str) -> Any | None:
        return self.records.get(key)

    def put(self, key: str, result: Any) -> None:
        self.records[key] = result
        write_json_atomic(self.path, {"runs": dict(sorted(self.records.items()))}, indent=0)


class RunFolders:
    """``alma study``'s cache: each run writes ``results.json`` into its own folder as it goes.

    A run is finished when that file holds the whole stream of the config planned for it; a run
    stopped mid-stream, or one written by another scale or code version, runs again."""

    def __init__(self, planned: Mapping[str, tuple[Path, dict[str, Any]]]):
        self.planned = planned

    def get(self, key: str) -> dict[str, Any] | None:
        return folder_results(*self.planned[key])

    def put(self, key: str, result: Any) -> None:
        """Nothing to keep: the run wrote its folder itself, each file replaced atomically."""


def folder_results(folder: Path, config: dict[str, Any]) -> dict[str, Any] | None:
    """The results in ``folder`` when they hold the whole stream for ``config``, else None."""
    from alma_daemon.observability.results import read_results

    path = folder / "results.json"
    if not path.is_file():
        return None
    try:
        results = read_results(path)
    except (OSError, ValueError):
        return None
    if json.loads(json.dumps(config)) != results.get("config"):
        return None
    if results.get("summary", {}).get("chunks") != config["stream"]["megabatches"]:
        return None
    return results


def resume(runs: Sequence[PoolRun], cache: RunCache) -> tuple[dict[str, Any], list[PoolRun]]:
    """The results the cache already holds, by key, and the runs still to do, in their order (a key
    given twice, as a variant asked for twice, runs once)."""
    finished: dict[str, Any] = {}
    todo: dict[str, PoolRun] = {}
    for run in runs:
        result = cache.get(run.key)
        if result is not None:
            finished[run.key] = result
        else:
            todo.setdefault(run.key, run)
    return finished, list(todo.values())


def run_each(
    runs: Sequence[PoolRun],
    cache: RunCache,
    *,
    jobs: int,
    on_done: Callable[[PoolRun, Any], None],
    on_failed: Callable[[PoolRun, Exception], None],
) -> None:
    """Run every run, put each result in ``cache``, then tell ``on_done``; tell ``on_failed`` of
    each that raised, and go on with the others (one failure must not lose the others' hours).

    ``jobs`` <= 1 runs them here, one after another in their order; more, in that many worker
    processes, reported as they finish."""
    if jobs <= 1:
        for run in runs:
            try:
                result = run.function(*run.arguments)
            except Exception as exc:
                on_failed(run, exc)
                continue
            cache.put(run.key, result)
            on_done(run, result)
        return
    if not runs:
        return
    with ProcessPoolExecutor(max_workers=jobs) as pool:
        futures = {pool.submit(run.function, *run.arguments): run for run in runs}
        for future in as_completed(futures):
            run = futures[future]
            try:
                result = future.result()
            except Exception as exc:  # a worker that died (BrokenProcessPool) fails every run left
                on_failed(run, exc)
                continue
            cache.put(run.key, result)
            on_done(run, result)


@contextmanager
def one_torch_thread() -> Iterator[None]:
    """Torch on one thread while the block runs.

    A run's figures then repeat bit for bit whatever ``jobs`` is: the thread count changes the
    order of floating-point sums."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


def simulate_on_one_thread(config: Config, folder: str | Path | None = None) -> dict[str, Any]:
    """One simulated stream on one torch thread, without a progress bar: its results (written into
    ``folder`` as it goes, when given)."""
    from alma_daemon.research.simulate import run_simulation

    with one_torch_thread():
        return run_simulation(config, folder, progress=False)
