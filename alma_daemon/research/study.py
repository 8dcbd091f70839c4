"""``alma study paper``: run the experiments behind the paper's findings, judge them, draw them.

A study is a list of experiments (each a grid of config values, like ``alma grid``), run once per
seed through the same engine as ``alma simulate``, one folder per run under ``OUT/runs/``. A run
whose ``results.json`` is complete and whose config is the planned one is not run again, so a study
interrupted and started again with the same ``--out`` goes on where it stopped (the run pool:
:mod:`alma_daemon.research.run_pool`). Then every finding
of :mod:`alma_daemon.research.findings` is judged on the runs, and ``findings.json``, ``report.md``,
``report.html`` and the figures are written.

The scale (B, widths, epochs, test subset) is a :class:`Scale`; ``full`` and ``quick`` are the two a
user runs; docs/findings.md says why they are what they are.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from alma_daemon.config import build_config, set_dotted, to_dict
from alma_daemon.core.atomic_json import write_json_atomic
from alma_daemon.logs import error_text
from alma_daemon.research.findings import F3_WAIT, FINDINGS, RunResult, judge_all
from alma_daemon.research.grid import expand_grid
from alma_daemon.research.run_pool import PoolRun, RunFolders, folder_results, resume, run_each, simulate_on_one_thread
from alma_daemon.research.simulate import replayed


@dataclass(frozen=True)
class Experiment:
    """A grid of runs behind one or more findings: fixed config values and the values it varies."""

    name: str
    what: str
    fixed: dict[str, Any]
    grid: dict[str, Any]


@dataclass(frozen=True)
class Scale:
    """What a study costs: the streams' sizes, the widths, the epoch caps and the test subsets."""

    name: str
    seeds: int
    mnist_megabatches: int
    mnist_examples: int | None
    mnist_waits: list[int]
    mnist_epochs: int
    mnist_wait_widths: list[int]
    mnist_method_widths: list[int]
    mnist_sm_sizes: list[int]
    mnist_methods_wait: int
    mnist_replay_wait: int
    mnist_replay_width: int
    cifar_megabatches: int
    cifar_examples: int | None
    cifar_waits: list[int]
    cifar_epochs: int
    cifar_width: int
    cifar_large_width: int
    test_examples: int
    extra: dict[str, Any] = field(default_factory=dict)


#: The scale of ``alma study paper``: docs/findings.md explains each choice.
FULL = Scale(
    name="full",
    seeds=3,
    mnist_megabatches=500,
    mnist_examples=None,
    mnist_waits=[1, 5, 10, 50, 500],
    mnist_epochs=5,
    mnist_wait_widths=[4, 64],
    mnist_method_widths=[4, 32],
    mnist_sm_sizes=[8, 16, 64],
    mnist_methods_wait=50,
    mnist_replay_wait=50,
    mnist_replay_width=8,
    cifar_megabatches=100,
    cifar_examples=None,
    cifar_waits=[1, 10, 100],
    cifar_epochs=3,
    cifar_width=4,
    cifar_large_width=16,
    test_examples=1000,
)

#: ``--quick``: every experiment, one seed, a fifth of MNIST's stream and of CIFAR-10's images, a
#: smaller large VGG and test set; the epochs per stage are the full study's.
QUICK = replace(
    FULL,
    name="quick",
    seeds=1,
    mnist_megabatches=100,
    mnist_examples=12_000,
    mnist_waits=[1, 5, 10, 50, 100],
    mnist_methods_wait=10,
    mnist_replay_wait=10,
    cifar_examples=10_000,
    cifar_large_width=8,
    test_examples=500,
)

SCALES = {scale.name: scale for scale in (FULL, QUICK)}


def paper_experiments(scale: Scale) -> list[Experiment]:
    """The experiments behind findings F1-F9 at ``scale``."""
    mnist = {
        "dataset.name": "mnist",
        "dataset.test_examples": scale.test_examples,
        "stream.megabatches": scale.mnist_megabatches,
        "stream.train_examples": scale.mnist_examples,
        "train.epochs": scale.mnist_epochs,
        **scale.extra,
    }
    cifar = {
        "dataset.name": "cifar10",
        "dataset.test_examples": scale.test_examples,
        "stream.megabatches": scale.cifar_megabatches,
        "stream.train_examples": scale.cifar_examples,
        "train.epochs": scale.cifar_epochs,
        **scale.extra,
    }
    return [
        Experiment(
            "mnist-wait",
            "SM on MNIST at every waiting time, small and large (F1, F3, F8, F9)",
            {**mnist, "learner.name": "sm"},
            {"learner.width": scale.mnist_wait_widths, "policy.wait": scale.mnist_waits},
        ),
        Experiment(
            "mnist-geometric",
            "SM on MNIST with the geometric wait, ratio 0.5 (F9)",
            {**mnist, "learner.name": "sm", "policy.name": "geometric", "policy.ratio": 0.5},
            {"learner.width": scale.mnist_wait_widths},
        ),
        Experiment(
            "mnist-methods",
            f"every method on MNIST at w = {scale.mnist_methods_wait}, small and large members (F4, F5, F6)",
            {**mnist, "policy.wait": scale.mnist_methods_wait},
            {
                "learner.name": ["sm", "ens", "umix", "gens", "gmoe", "firefly"],
                "learner.width": scale.mnist_method_widths,
            },
        ),
        Experiment(
            "mnist-sm-sizes",
            f"SM of more sizes at w = {scale.mnist_methods_wait}: the fixed models growing ones face (F4, F6)",
            {**mnist, "learner.name": "sm", "policy.wait": scale.mnist_methods_wait},
            {"learner.width": scale.mnist_sm_sizes},
        ),
        Experiment(
            "mnist-replay",
            f"SM and gEns on MNIST at w = {scale.mnist_replay_wait}, without and with replay (F7)",
            {**mnist, "learner.width": scale.mnist_replay_width, "policy.wait": scale.mnist_replay_wait},
            {"learner.name": ["sm", "gens"], "stream.replay": [False, True]},
        ),
        Experiment(
            "cifar-wait",
            "SM (reduced VGG) on CIFAR-10 at greedy, intermediate and tardy waits (F2, F3)",
            {**cifar, "learner.name": "sm", "learner.width": scale.cifar_width},
            {"policy.wait": scale.cifar_waits},
        ),
        Experiment(
            "cifar-large",
            f"a larger SM on CIFAR-10 at w = {F3_WAIT} (F3)",
            {**cifar, "learner.name": "sm", "policy.wait": F3_WAIT},
            {"learner.width": [scale.cifar_large_width]},
        ),
    ]


@dataclass(frozen=True)
class PlannedRun:
    """One run of a study: its experiment, the config values it sets, its seed, its folder."""

    experiment: str
    params: dict[str, Any]
    seed: int
    folder: Path
    config: dict[str, Any]

    @property
    def label(self) -> str:
        return f"{self.experiment}/{self.folder.name}"


def plan_runs(experiments: list[Experiment], seeds: int, out: Path) -> list[PlannedRun]:
    """Every run of every experiment, seed by seed, cheapest experiments' seed 0 first."""
    runs = []
    for seed in range(seeds):
        for experiment in experiments:
            for grid_run in expand_grid({"grid": experiment.grid}):
                data: dict[str, Any] = {}
                for key, value in {**experiment.fixed, **grid_run.overrides}.items():
                    set_dotted(data, key, value)
                set_dotted(data, "seed", seed)
                set_dotted(data, "stream.seed", seed)
                # As the simulation writes it in its results (their config is the cache's key).
                config = to_dict(replayed(build_config(data)))
                folder = out / "runs" / experiment.name / f"{grid_run.name},seed={seed}"
                params = {**experiment.fixed, **grid_run.overrides}
                runs.append(PlannedRun(experiment.name, params, seed, folder, config))
    return runs


def execute_run(config: dict[str, Any], folder: str) -> float:
    """Run one planned simulation into ``folder``; return its wall seconds."""
    start = time.perf_counter()
    simulate_on_one_thread(build_config(config), folder)
    return time.perf_counter() - start


class Progress:
    """Runs done and to do, and the time left estimated from the runs finished so far."""

    def __init__(self, runs: list[PlannedRun], done: dict[str, float], jobs: int, say: Callable[[str], None]):
        self.runs, self.done, self.jobs, self.say = runs, dict(done), jobs, say
        self.started = time.time()

    def estimate(self, run: PlannedRun) -> float | None:
        same = [s for label, s in self.done.items() if label.startswith(run.experiment + "/")]
        pool = same or list(self.done.values())
        return sum(pool) / len(pool) if pool else None

    def left_seconds(self) -> float | None:
        left = [self.estimate(r) for r in self.runs if r.label not in self.done]
        if any(e is None for e in left):
            return None
        return sum(e for e in left if e is not None) / self.jobs

    def report(self, run: PlannedRun, seconds: float | None, failed: str | None = None) -> None:
        if seconds is not None:
            self.done[run.label] = seconds
        left = self.left_seconds()
        eta = "unknown" if left is None else _duration(left)
        outcome = f"failed: {failed}" if failed else f"{seconds:.0f} s"
        self.say(f"[{len(self.done)}/{len(self.runs)}] {run.label}: {outcome}; time left about {eta}")


def _duration(seconds: float) -> str:
    minutes = round(seconds / 60)
    return (
        f"{seconds:.0f} s"
        if seconds < 90
        else f"{minutes // 60} h {minutes % 60} min"
        if minutes >= 60
        else f"{minutes} min"
    )


def run_study(
    out: str | Path,
    scale: Scale = FULL,
    *,
    seeds: int | None = None,
    jobs: int = 1,
    experiments: list[Experiment] | None = None,
    say: Callable[[str], None] = print,
) -> list[dict[str, Any]]:
    """Run (or resume) the study into ``out``, judge the findings, write the report; return them."""
    out = Path(out)
    experiments = experiments if experiments is not None else paper_experiments(scale)
    seeds = seeds if seeds is not None else scale.seeds
    runs = plan_runs(experiments, seeds, out)
    planned = {r.label: r for r in runs}
    folders = RunFolders({r.label: (r.folder, r.config) for r in runs})
    finished, todo = resume([PoolRun(r.label, execute_run, (r.config, str(r.folder))) for r in runs], folders)
    done = {label: results["summary"].get("wall_seconds", 0.0) for label, results in finished.items()}
    write_json_atomic(
        out / "study.json",
        {"scale": scale.name, "seeds": seeds, "experiments": [e.__dict__ for e in experiments], "runs": len(runs)},
    )
    say(f"study {scale.name}: {len(runs)} runs ({seeds} seed(s)); {len(done)} already finished in {out}")
    progress = Progress(runs, done, jobs, say)
    failures = {}

    def failed(run: PoolRun, exc: Exception) -> None:
        failures[run.key] = error_text(exc)
        progress.report(planned[run.key], None, failures[run.key])

    run_each(
        todo,
        folders,
        jobs=jobs,
        on_done=lambda run, seconds: progress.report(planned[run.key], seconds),
        on_failed=failed,
    )
    results = collect(runs)
    # A seed with runs missing (failed, or the study was stopped) is left out of every verdict: a
    # rule must not compare one seed's finished runs with another seed's.
    counts = {seed: sum(1 for r in runs if r.seed == seed) for seed in range(seeds)}
    complete = [seed for seed in range(seeds) if sum(1 for r in results if r.seed == seed) == counts[seed]]
    findings = judge_all([r for r in results if r.seed in complete])
    summary = {"runs": len(results), "of": len(runs), "seeds_judged": complete, "failed_runs": failures}
    write_json_atomic(out / "findings.json", {"findings": findings, **summary})
    if len(complete) < seeds:
        on = f"seed(s) {complete} only" if complete else "no seed"
        say(f"judged on {on}: the others have runs missing; run the study again to finish them")
    from alma_daemon.research.study_report import write_study_report

    write_study_report(out, experiments, findings, scale, seeds, complete)
    return findings


def collect(runs: list[PlannedRun]) -> list[RunResult]:
    """The finished runs as the rules read them."""
    results = []
    for run in runs:
        res = folder_results(run.folder, run.config)
        if res is None:
            continue
        errors = [r.get("test_error") for r in res["series"]]
        results.append(RunResult(run.experiment, run.params, run.seed, res["summary"], errors))
    return results


def describe(experiments: list[Experiment] | None = None, scale: Scale = FULL) -> str:
    """``alma study --list``: the studies, their experiments and the findings they judge."""
    experiments = experiments if experiments is not None else paper_experiments(scale)
    lines = [f"paper (scale {scale.name}, {scale.seeds} seed(s); --quick: scale quick)", "  experiments:"]
    for e in experiments:
        count = len(expand_grid({"grid": e.grid}))
        lines.append(f"    {e.name:<16} {count:>2} run(s) per seed  {e.what}")
    lines.append("  findings:")
    lines += [f"    {f.id}  {f.claim}" for f in FINDINGS]
    return "\n".join(lines)
