"""alma-daemon against River's own incremental models on River's streams (issue 34, item 5; regression: issue 42).

Every contender sees the same examples in the same order: a River stream read once
(``alma_daemon.data.river_streams``), cut into B contiguous chunks, its continuation held out as
the test set. Per stream and contender:

- **prequential error**: every example predicted before any model trained on it. River's models
  predict then learn one example at a time; alma-daemon predicts a whole chunk with the model it
  has (the engine's prequential measure), then its adaptive policy decides whether to train;
- **CER**: the test error after every chunk, summed over the B chunks (River's models measured at
  the same chunk boundaries on the same test set);
- **time per example**: wall and CPU seconds of the stream (alma-daemon: the engine's wall time,
  with its test passes; River: the predict-then-learn loop, without the CER's test passes) divided by
  the examples streamed. CPU seconds are the fairer figure on a shared machine: every contender uses
  one thread (torch set to one), so they do not count other jobs' time.

alma-daemon runs a team's own model (``examples/custom/tabular.py``, ``learner.model``) under the
adaptive policy. River runs ``LogisticRegression`` (standardized; one-vs-rest on multi-class
streams), ``HoeffdingAdaptiveTreeClassifier`` and ``ARFClassifier`` (10 trees), with their defaults.

On a regression stream (``friedman``, ``friedman-drift``) the measures are the mean squared and the
mean absolute error: prequential, summed over the chunks' test measurements (the CER's analogue) and
final. alma-daemon runs twice, trained and judged by each (``task.measure`` mse, then mae: the
squared error, then the absolute error, of the standardized target); River runs ``LinearRegression``
(features and target standardized), ``HoeffdingAdaptiveTreeRegressor`` and ``ARFRegressor`` (10
trees), whose every prediction is scored by both measures.

Since issue 50 every alma run also learns a River linear reference prequentially beside the network
(``reference.kind: auto``: ``StandardScaler | LogisticRegression``, one-vs-rest on more classes,
``LinearRegression`` on a regression), measured on each chunk before it learns it, as the network is:
the tables show its prequential and **served** measure (the mean over the stream's second half of the
chunks, ``served_reference_*`` of the run's summary) as a row of its own, and a line per stream says
whether alma's served measure is at or below it. Every contender's served measure is the mean of its
per-chunk prequential measures over the last half of the chunks (River's own models predict and learn one
example at a time, so theirs are finer-grained than the chunk-prequential reference's).

alma runs by default with the stage recipe of a team's task (pooled validation set, class-stratified replay
reservoir; streams of two classes or a regression: the multi-class streams without ``task.measure`` keep the
paper's recipe); ``--recipe old`` runs it with ``stream.replay: false``, ``stream.validation_examples: 0``.

    python benchmarks/bench_river.py                       # the six classification streams, about 10 min on 2 cores
    python benchmarks/bench_river.py --recipe old --out benchmarks/results/river_old_recipe.json
    python benchmarks/bench_river.py --recipe linear --out benchmarks/results/river_linear.json
    python benchmarks/bench_river.py --policy team-default --out benchmarks/results/river_team_default.json
    python benchmarks/bench_river.py --policy team-default --recipe stage-2000 --streams agrawal sea hyperplane bananas --out benchmarks/results/river_one_default.json
    python benchmarks/bench_river.py --streams friedman friedman-drift --out benchmarks/results/river_regression.json
    python benchmarks/bench_river.py --streams agrawal sea --examples 5000
"""

from __future__ import annotations

import argparse
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from figures_file import write_figures  # this script's folder is on sys.path when it runs

from alma_daemon.config import build_config
from alma_daemon.data.river_streams import RIVER_STREAMS, RiverData, read_river
from alma_daemon.observability.served_measure import judged_mean
from alma_daemon.research.simulate import run_simulation

RESULTS = Path(__file__).resolve().parent / "results"
ROOT = Path(__file__).resolve().parents[1]

#: River's contenders by the kind of stream they learn: name -> a fresh model for a stream of that many classes.
RIVER_MODELS: dict[str, dict[str, Callable[[int], Any]]] = {"classification": {}, "regression": {}}
#: A regression's measures: each prediction's loss by measure name.
REGRESSION_LOSSES: dict[str, Callable[[float], float]] = {"mse": lambda error: error * error, "mae": abs}
#: alma's stage recipes (issue 50): name -> config overrides. new: the defaults of a team's task.
RECIPES: dict[str, dict[str, dict]] = {
    "new": {},
    "old": {"stream": {"replay": False, "validation_examples": 0}},
    "no-reset": {"stream": {"reservoir_reset": False}},
    "linear": {"train": {"linear_candidate": True}},
    "stage-2000": {"stream": {"stage_examples": 2000}},
    "stage-3000": {"stream": {"stage_examples": 3000}},
    "stage-4000": {"stream": {"stage_examples": 4000}},
}
#: alma's policies by name: the adaptive policy alone, with the bound of a team's one default (docs/policies.md,
#: "One default for a team"; with --recipe stage-2000 the whole of it), and with River's Page-Hinkley test
#: without and with a looser bound (candidates for the one default).
POLICIES: dict[str, dict] = {
    "adaptive": {"name": "adaptive"},
    "team-default": {"name": "adaptive", "max_model_age_examples": 500},
    "page-hinkley": {"name": "adaptive", "drift_detector": "page_hinkley"},
    "page-hinkley-2000": {"name": "adaptive", "drift_detector": "page_hinkley", "max_model_age_examples": 2000},
}
#: The row of the River linear reference that learned beside alma's network (the run's summary).
REFERENCE = "alma's River linear reference (chunk-prequential, beside the MLP)"


def river_model(name: str, kind: str = "classification") -> Callable[[Callable[[int], Any]], Callable[[int], Any]]:
    def register(build: Callable[[int], Any]) -> Callable[[int], Any]:
        RIVER_MODELS[kind][name] = build
        return build

    return register


@river_model("river LogisticRegression")
def _logistic(classes: int) -> Any:
    from river import linear_model, multiclass, preprocessing

    model = linear_model.LogisticRegression()
    return preprocessing.StandardScaler() | (model if classes == 2 else multiclass.OneVsRestClassifier(model))


@river_model("river HoeffdingAdaptiveTree")
def _hat(classes: int) -> Any:
    from river import tree

    return tree.HoeffdingAdaptiveTreeClassifier(seed=0)


@river_model("river ARF")
def _arf(classes: int) -> Any:
    from river import forest

    return forest.ARFClassifier(seed=0)


@river_model("river LinearRegression", "regression")
def _linear(outputs: int) -> Any:
    from river import linear_model, preprocessing

    # The target standardized as alma-daemon's is: plain SGD on a target of mean 14 learns its intercept slowly.
    pipeline = preprocessing.StandardScaler() | linear_model.LinearRegression()
    return preprocessing.TargetStandardScaler(pipeline)  # type: ignore[arg-type]  # a pipeline ending in a regressor is one


@river_model("river HoeffdingAdaptiveTree", "regression")
def _hat_regressor(outputs: int) -> Any:
    from river import tree

    return tree.HoeffdingAdaptiveTreeRegressor(seed=0)


@river_model("river ARF", "regression")
def _arf_regressor(outputs: int) -> Any:
    from river import forest

    return forest.ARFRegressor(seed=0)


def streamed(river: RiverData, megabatches: int) -> int:
    """The examples the chunks hold: B equal contiguous chunks, the remainder dropped."""
    return len(river.train) // megabatches * megabatches


def as_dicts(river: RiverData, data: Any) -> list[dict[str, float]]:
    names = river.task.extra["features"]
    return [dict(zip(names, row)) for row in data.x.tolist()]


def run_river_model(name: str, river: RiverData, megabatches: int) -> dict:
    """Predict then learn every streamed example in order; the test error after every chunk."""
    model = RIVER_MODELS["classification"][name](river.task.num_classes)
    count = streamed(river, megabatches)
    size = count // megabatches
    xs, ys = as_dicts(river, river.train)[:count], river.train.y.tolist()[:count]
    test_xs, test_ys = as_dicts(river, river.test), river.test.y.tolist()
    errors, test_errors, chunk_errors, wall, cpu = 0, [], [], 0.0, 0.0
    for start in range(0, count, size):
        wall_start, cpu_start = time.perf_counter(), time.process_time()
        wrong_in_chunk = 0
        for x, y in zip(xs[start : start + size], ys[start : start + size]):
            wrong_in_chunk += model.predict_one(x) != y
            model.learn_one(x, y)
        wall += time.perf_counter() - wall_start
        cpu += time.process_time() - cpu_start
        errors += wrong_in_chunk
        chunk_errors.append(wrong_in_chunk / size)
        wrong = sum(model.predict_one(x) != y for x, y in zip(test_xs, test_ys))
        test_errors.append(wrong / len(test_ys))
    return {**summary(errors / count, test_errors, wall, cpu, count), "served_error": judged_mean(chunk_errors)}


def run_river_regressor(name: str, river: RiverData, megabatches: int) -> dict:
    """Predict then learn every streamed example in order, scored by every regression measure; the test
    measures after every chunk."""
    model = RIVER_MODELS["regression"][name](1)
    count = streamed(river, megabatches)
    size = count // megabatches
    xs, ys = as_dicts(river, river.train)[:count], river.train.y.tolist()[:count]
    test_xs, test_ys = as_dicts(river, river.test), river.test.y.tolist()
    totals = dict.fromkeys(REGRESSION_LOSSES, 0.0)
    tests: dict[str, list[float]] = {m: [] for m in REGRESSION_LOSSES}
    chunks: dict[str, list[float]] = {m: [] for m in REGRESSION_LOSSES}
    wall = cpu = 0.0
    for start in range(0, count, size):
        wall_start, cpu_start = time.perf_counter(), time.process_time()
        in_chunk = dict.fromkeys(REGRESSION_LOSSES, 0.0)
        for x, y in zip(xs[start : start + size], ys[start : start + size]):
            error = model.predict_one(x) - y
            for measure, loss in REGRESSION_LOSSES.items():
                in_chunk[measure] += loss(error)
            model.learn_one(x, y)
        wall += time.perf_counter() - wall_start
        cpu += time.process_time() - cpu_start
        for measure in REGRESSION_LOSSES:
            totals[measure] += in_chunk[measure]
            chunks[measure].append(in_chunk[measure] / size)
        errors = [model.predict_one(x) - y for x, y in zip(test_xs, test_ys)]
        for measure, loss in REGRESSION_LOSSES.items():
            tests[measure].append(sum(map(loss, errors)) / len(errors))
    figures = {key: value for m in REGRESSION_LOSSES for key, value in measured(m, totals[m] / count, tests[m]).items()}
    figures.update({f"served_{m}": judged_mean(chunks[m]) for m in REGRESSION_LOSSES})
    return {**figures, **timings(wall, cpu, count)}


def run_alma(
    stream: str,
    examples: int,
    megabatches: int,
    seed: int,
    measure: str | None = None,
    recipe: str = "new",
    policy: str = "adaptive",
) -> dict:
    """``alma simulate`` of the stream: the team's MLP of examples/custom/tabular.py, the policy ``policy``
    (:data:`POLICIES`), the default training (up to 100 epochs a stage, early stopping after 25), trained and
    judged by ``measure`` (None: the task's default, the error rate of a classifier), under stage recipe
    ``recipe`` (:data:`RECIPES`). Its River linear reference's figures, where one ran, are under ``reference``."""
    overrides = RECIPES[recipe]
    config = build_config(
        {
            "dataset": {"name": "river", "river_stream": stream, "river_examples": examples},
            "stream": {"megabatches": megabatches, "seed": seed, **overrides.get("stream", {})},
            "learner": {"name": "sm", "model": "examples.custom.tabular:build"},
            "policy": POLICIES[policy],
            **({"train": overrides["train"]} if "train" in overrides else {}),
            **({"task": {"measure": measure}} if measure else {}),
        }
    )
    cpu_start = time.process_time()
    results = run_simulation(config, progress=False)
    cpu = time.process_time() - cpu_start
    series, done = results["series"], results["summary"]
    count = series[-1]["examples_seen"]
    m = done["measure"]
    # Chunks are of equal size, so the mean of the chunks' prequential measures is the per-example one.
    prequential = done[f"cumulative_prequential_{m}"] / done["chunks"]
    if m == "error":
        figures = summary(prequential, [row["test_error"] for row in series], done["wall_seconds"], cpu, count)
    else:
        figures = {**measured(m, prequential, [row[f"test_{m}"] for row in series])}
        figures.update(timings(done["wall_seconds"], cpu, count))
    figures[f"served_{m}"] = done.get(f"served_{m}")
    reference = {}
    if done.get(f"cumulative_reference_{m}") is not None:
        reference = {
            f"prequential_{m}": done[f"cumulative_reference_{m}"] / done["chunks"],
            f"served_{m}": done.get(f"served_reference_{m}"),
        }
    return {**figures, "stages": done["stages"], "recipe": recipe, "reference": reference}


def measured(measure: str, prequential: float, tests: list[float]) -> dict:
    """A regression measure's figures: prequential, summed over the chunks' test measurements, final."""
    return {
        f"prequential_{measure}": prequential,
        f"cumulative_{measure}": sum(tests),
        f"final_test_{measure}": tests[-1],
    }


def timings(wall: float, cpu: float, count: int) -> dict:
    return {
        "wall_seconds": wall,
        "cpu_seconds": cpu,
        "wall_us_per_example": 1e6 * wall / count,
        "cpu_us_per_example": 1e6 * cpu / count,
        "examples": count,
    }


def summary(prequential: float, test_errors: list[float], wall: float, cpu: float, count: int) -> dict:
    return {
        "prequential_error": prequential,
        "cer": sum(test_errors),
        "final_test_error": test_errors[-1],
        **timings(wall, cpu, count),
    }


def number(r: dict, key: str, digits: int) -> str:
    return "-" if r.get(key) is None else f"{r[key]:.{digits}f}"


def table(results: dict[str, dict[str, dict]]) -> str:
    """The classification streams' table (a regression stream's: :func:`regression_table`), then per stream
    alma's served error against its linear reference's."""
    lines = [
        "| stream | contender | prequential error | served error | CER | final test error | CPU µs/example "
        "| wall µs/example |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for stream, contenders in results.items():
        for name, r in contenders.items():
            cells = [
                number(r, "prequential_error", 4),
                number(r, "served_error", 4),
                number(r, "cer", 3),
                number(r, "final_test_error", 4),
                number(r, "cpu_us_per_example", 0),
                number(r, "wall_us_per_example", 0),
            ]
            lines.append(f"| {stream} | {name} | {' | '.join(cells)} |")
    return "\n".join(lines + against_reference(results, ["error"]))


def against_reference(results: dict[str, dict[str, dict]], measures: list[str]) -> list[str]:
    """Per stream and measure: alma's served measure against its linear reference's (lower is better)."""
    lines = []
    for stream, contenders in results.items():
        reference = contenders.get(REFERENCE)
        for m in measures:
            ours = next(
                (r for n, r in contenders.items() if n.startswith("alma-daemon") and r.get(f"served_{m}") is not None),
                None,
            )
            if ours is None or reference is None or reference.get(f"served_{m}") is None:
                continue
            a, b = ours[f"served_{m}"], reference[f"served_{m}"]
            verdict = "at or below it" if a <= b else "ABOVE it"
            lines.append(f"- {stream}: alma's served {m} {a:.4f}, the linear reference's {b:.4f}: {verdict}")
    return ["", *lines] if lines else []


def regression_table(results: dict[str, dict[str, dict]]) -> str:
    """The regression streams' table: each measure where the contender was judged by it (- elsewhere)."""
    columns = [
        (f"{kind}_{m}", f"{label} {m.upper()}")
        for m in REGRESSION_LOSSES
        for kind, label in (
            ("prequential", "prequential"),
            ("served", "served"),
            ("cumulative", "summed test"),
            ("final_test", "final test"),
        )
    ]
    lines = [
        "| stream | contender | " + " | ".join(label for _, label in columns) + " | CPU µs/example | wall µs/example |",
        "|---|---|" + "---|" * len(columns) + "---|---|",
    ]
    for stream, contenders in results.items():
        for name, r in contenders.items():
            cells = [number(r, key, 3) for key, _ in columns]
            times = [number(r, "cpu_us_per_example", 0), number(r, "wall_us_per_example", 0)]
            lines.append(f"| {stream} | {name} | {' | '.join(cells + times)} |")
    return "\n".join(lines + against_reference(results, list(REGRESSION_LOSSES)))


def run_stream(stream: str, args: argparse.Namespace) -> tuple[dict[str, dict], str]:
    """Every contender on ``stream`` (alma's linear reference a row of its own), and the table they go in."""
    river = read_river(stream, args.examples, args.seed)
    recipe, policy = args.recipe, args.policy
    if river.task.regression:
        contenders = {
            f"alma-daemon MLP ({policy}, {m})": run_alma(
                stream, args.examples, args.megabatches, args.seed, m, recipe, policy
            )
            for m in REGRESSION_LOSSES
        }
        # Each run's reference is judged by that run's measure: one row of both.
        reference = {k: v for r in contenders.values() for k, v in r.pop("reference").items()}
        contenders.update({REFERENCE: reference} if reference else {})
        for name in RIVER_MODELS["regression"]:
            contenders[name] = run_river_regressor(name, river, args.megabatches)
        return contenders, "regression"
    ours = f"alma-daemon MLP ({policy})"
    contenders = {ours: run_alma(stream, args.examples, args.megabatches, args.seed, None, recipe, policy)}
    reference = contenders[ours].pop("reference")
    contenders.update({REFERENCE: reference} if reference else {})
    for name in RIVER_MODELS["classification"]:
        contenders[name] = run_river_model(name, river, args.megabatches)
    return contenders, "classification"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    classifiers = [name for name, stream in RIVER_STREAMS.items() if not stream.regression]
    parser.add_argument("--streams", nargs="+", default=classifiers, choices=list(RIVER_STREAMS))
    parser.add_argument("--examples", type=int, default=20000, help="dataset.river_examples (a tenth is the test set)")
    parser.add_argument("--megabatches", type=int, default=20)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--recipe",
        choices=list(RECIPES),
        default="new",
        help="alma's stage recipe: new (the defaults since issue 50), old (stream.replay false, "
        "stream.validation_examples 0), no-reset (new, stream.reservoir_reset false), linear (new, with "
        "train.linear_candidate), stage-2000, stage-3000 or stage-4000 (new, with stream.stage_examples; streams of two "
        "classes or a regression)",
    )
    parser.add_argument(
        "--policy",
        choices=list(POLICIES),
        default="adaptive",
        help="alma's policy: adaptive, team-default (adaptive with policy.max_model_age_examples 500; with "
        "--recipe stage-2000, a team's one default), page-hinkley (adaptive with policy.drift_detector "
        "page_hinkley) or page-hinkley-2000 (page-hinkley with policy.max_model_age_examples 2000)",
    )
    parser.add_argument("--out", default=str(RESULTS / "river.json"))
    args = parser.parse_args()
    # One thread for every contender: River is single-threaded Python, and CPU seconds stay comparable.
    torch.set_num_threads(1)
    args.out = str(Path(args.out).resolve())  # a relative --out is the caller's, not the repository's
    os.chdir(ROOT)  # learner.model is imported from the working directory
    load_before = os.getloadavg()
    results: dict[str, dict[str, dict]] = {}
    by_kind: dict[str, dict[str, dict[str, dict]]] = {"classification": {}, "regression": {}}
    tables = {"classification": table, "regression": regression_table}
    for stream in args.streams:
        contenders, kind = run_stream(stream, args)
        results[stream] = by_kind[kind][stream] = contenders
        print(tables[kind]({stream: contenders}).split("\n", 2)[2], flush=True)
    settings = {key: getattr(args, key) for key in ("examples", "megabatches", "seed", "recipe", "policy")}
    write_figures(args.out, {"settings": settings, "streams": results}, load_before)
    markdown = "\n\n".join(tables[kind](streams) for kind, streams in by_kind.items() if streams)
    heading = (
        f"River seed {args.seed}, {args.examples} examples (a tenth the test set) in {args.megabatches} chunks; "
        f"alma's stage recipe: {args.recipe}; policy: {args.policy}; load average {load_before[0]:.1f} before, {os.getloadavg()[0]:.1f} after."
    )
    markdown = f"{heading}\n\n{markdown}"
    Path(args.out).with_suffix(".md").write_text(markdown + "\n")
    print(markdown)


if __name__ == "__main__":
    main()
