"""Long streams (issue 43): the policies on a stream that never ends, judged by the error users saw.

On a finite stream the CER (the summed test measure) rewards leaving the stream's tail untrained: its
test set is the stream's end, and a stage near the end costs FLOPs whose benefit the sum barely sees.
On a stream that never ends a policy is judged instead by its served measure: the prequential measure
each chunk met when it arrived, averaged over the stream's second half
(alma_daemon/observability/served_measure.py), beside the CER, the training FLOPs and the longest run
of chunks without a stage.

Each stream is long (2,000 chunks of 100 examples by default) and the model small (SM, an MLP of
``--width`` units, ``--epochs`` epochs a stage), so the grid fits a shared laptop's cores. Streams:
River's rotating hyperplane (incremental drift: a model left alone goes stale) and Friedman #1 (a
stationary regression, MSE: there is nothing to go stale; River has no stationary classification
generator of unbounded length). Each runs the schedules (fixed waits ``--waits`` and geometric 0.5),
then adaptive and forecast, each without the freshness bound and with ``policy.max_model_age_chunks``
in ``--bounds``, geometric 0.5 with the same bounds (what the bound alone does), and adaptive unbounded
with River's sequential drift tests (``--detectors``: do they see a model going stale?), without and
with the bounds. The goal of the
issue: adaptive with the bound at or below the best schedule's served measure, at no more FLOPs.
Every stage runs all ``--epochs`` (the patience is longer), so a policy's FLOPs differ from another's
only by the chunks it leaves untrained at the end; what a stage costs beside its FLOPs shows in its
count of stages.

The bound is chosen on some seeds and judged on others: run the report once per seed set (``--seeds``,
``--bounds``, ``--out``); the runs share one cache (``--runs``: JSON, rewritten after every run,
alma_daemon/research/run_pool.py), so an interrupted benchmark resumes where it stopped, and
``--report-only`` rebuilds the tables and figures from the cache alone. Each run uses one torch thread,
so its results do not depend on ``--jobs``.

Recipes (issue 50). A team's task (two classes, a regression) now trains each stage by a new recipe: a
pooled validation set, a recency-weighted class-stratified replay reservoir (``stream.replay_keep:
classes``), and, where a binary task is judged by cost, the cost-minimizing decision.
``--recipes old new`` runs every configuration under each (:data:`RECIPES`; the recipe is part of a run's
cache key and of its label), ``--replay-examples N`` adds the new recipe with a replay set of N examples
(``--stage-examples N``: with stages of at least N examples),
and the report adds a table per stream of each policy's served measure and FLOPs under each recipe,
beside the served measure of the River linear reference that learns prequentially beside the network
(``served_reference_*``). The old recipe is the override set ``stream.replay: false``,
``stream.validation_examples: 0`` (no stream here is judged by cost, so ``task.decision`` is left alone).
Runs of the cache written before recipes existed (issue 43, keys without a recipe) count as the old
recipe's. Streams beside the registry's (``agrawal-stationary``): River's Agrawal without drift,
written by this script as an ``.npz`` table (``dataset.name: table``), since the registry has no
stationary classification generator of unbounded length.

    nice python benchmarks/bench_long_stream.py --recipes old --seeds 0 1 --bounds 5 10 25 50 --detectors page_hinkley adwin --out benchmarks/results/long_stream_tune.json --jobs 2
    nice python benchmarks/bench_long_stream.py --recipes old --seeds 2 3 4 5 --bounds 10 25 --detectors page_hinkley --jobs 2
    nice python benchmarks/bench_long_stream.py --recipes old new --streams hyperplane friedman agrawal agrawal-stationary --policies adaptive --waits 1 4 --bounds 10 --detectors --chunks 400 --chunk-examples 100 --seeds 2 3 --runs benchmarks/results/long_stream_recipe_runs.json --out benchmarks/results/long_stream_recipe.json --figures benchmarks/results/figures --jobs 2
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from policy_settings import RESULTS, policy_label  # a helper beside this script: its folder is on sys.path

from alma_daemon.observability.policy_regret import SCHEDULES, Outcome, paired_difference, regrets
from alma_daemon.research.run_pool import PoolRun, RecordFile, resume, run_each

FIGURES = Path(__file__).resolve().parents[1] / "docs" / "figures"

#: name -> (config overrides, what the stream is)
STREAMS: dict[str, tuple[dict, str]] = {
    "hyperplane": (
        {"dataset.river_stream": "hyperplane"},
        "River rotating hyperplane (incremental drift, 5 % label noise), error",
    ),
    "friedman": (
        {"dataset.river_stream": "friedman"},
        "River Friedman #1 (stationary regression, unit noise), MSE",
    ),
    "agrawal": (
        {"dataset.river_stream": "agrawal"},
        "River Agrawal (abrupt drift halfway: function 1 -> 2), error",
    ),
    "agrawal-stationary": (
        {},  # a table this script writes (TABLE_STREAMS): the registry has no stationary classification generator
        "River Agrawal function 1 without drift, as an .npz table (stationary classification), error",
    ),
}


def _stationary_agrawal(seed: int) -> Any:
    from river.datasets import synth

    return synth.Agrawal(classification_function=1, seed=seed)


#: Streams written by this script as an .npz table (dataset.name: table): name -> River's examples of a seed.
TABLE_STREAMS: dict[str, Callable[[int], Any]] = {"agrawal-stationary": _stationary_agrawal}
WAITS = [1, 2, 5, 10, 20, 50]
POLICIES = ["geometric", "adaptive", "forecast"]

#: recipe -> (config overrides, what it is). "new" is the default of a team's task since issue 50.
RECIPES: dict[str, tuple[dict, str]] = {
    "old": (
        {"stream.replay": False, "stream.validation_examples": 0},
        "before issue 50: no replay, each stage validates on its own chunks' share",
    ),
    "new": (
        {},
        "issue 50's default: pooled validation set (2,000), class-stratified replay reservoir (4,000, half-life 1 chunk), "
        "the last epoch kept unless beaten by more than its standard error",
    ),
    "no-reset": (
        {"stream.reservoir_reset": False},
        "the new recipe without the reservoir reset: the old examples leave only as the half-life decays them",
    ),
    "best-epoch": (
        {"train.keep_epoch": "best"},
        "the new recipe keeping each stage's best epoch (before train.keep_epoch)",
    ),
    "linear": (
        {"train.linear_candidate": True},
        "the new recipe with a linear candidate beside the network (train.linear_candidate)",
    ),
}
REPLAY_RECIPE = "new, replay {}"
STAGE_RECIPE = "new, stage {}"
#: The judgement asked of the new recipe's adaptive policy: served within this share of the best schedule's ...
SERVED_TOLERANCE = 0.03
#: ... at no more than this many times its FLOPs.
FLOPS_TOLERANCE = 1.25


def recipes(names: list[str], replay_examples: list[int], stage_examples: list[int]) -> dict[str, dict]:
    """The recipes to run by name: ``names`` of :data:`RECIPES`, then the new recipe with each replay set size
    and with each smallest stage size."""
    chosen = {name: RECIPES[name][0] for name in names}
    chosen.update({REPLAY_RECIPE.format(n): {"stream.replay_examples": n} for n in replay_examples})
    chosen.update({STAGE_RECIPE.format(n): {"stream.stage_examples": n} for n in stage_examples})
    return chosen


def label(policy: dict) -> str:
    detector = policy.get("policy.drift_detector")
    age = policy.get("policy.max_model_age_chunks")
    examples = policy.get("policy.max_model_age_examples")
    text = policy_label(policy) + (f" {detector}" if detector is not None else "")
    text += f", age <= {age}" if age is not None else ""
    return text + (f", age <= {examples} examples" if examples is not None else "")


def grid(
    waits: list[int],
    bounds: list[int],
    detectors: list[str],
    policies: list[str] = POLICIES,
    example_bounds: tuple[int, ...] | list[int] = (),
) -> list[dict]:
    """The schedules, then geometric 0.5, adaptive and forecast (those of ``policies``) without and with each
    freshness bound (in chunks, then in examples), then adaptive with each other drift detector (do the
    sequential tests see a model going stale?), without and with each bound in chunks."""
    schedules = [{"policy.name": "fixed", "policy.wait": w} for w in waits]
    bounded = []
    if "geometric" in policies:
        schedules.append({"policy.name": "geometric", "policy.ratio": 0.5})
        bounded += [{"policy.name": "geometric", "policy.ratio": 0.5, "policy.max_model_age_chunks": b} for b in bounds]
    for name in (p for p in ("adaptive", "forecast") if p in policies):
        bounded += [{"policy.name": name}]
        bounded += [{"policy.name": name, "policy.max_model_age_chunks": b} for b in bounds]
        bounded += [{"policy.name": name, "policy.max_model_age_examples": b} for b in example_bounds]
    detecting = [
        {"policy.name": "adaptive", "policy.drift_detector": d, **({"policy.max_model_age_chunks": b} if b else {})}
        for d in detectors
        for b in [None, *bounds]
    ]
    return schedules + bounded + detecting


def is_schedule(policy: dict) -> bool:
    """A schedule in hindsight: it reads nothing of the stream and has no bound."""
    bounded = "policy.max_model_age_chunks" in policy or "policy.max_model_age_examples" in policy
    return policy["policy.name"] in SCHEDULES and not bounded


def river_examples(chunks: int, chunk_examples: int) -> int:
    """Examples to read so that ``chunks`` chunks of ``chunk_examples`` arrive, the tenth after them the test set."""
    train = chunks * chunk_examples
    return train + train // 9


def run_key(stream: str, policy: dict, seed: int, common: dict, recipe: dict | None = None) -> str:
    """A run's cache key; ``recipe`` (the recipe's config overrides) None: a run from before recipes existed."""
    key = {"stream": stream, "policy": policy, "seed": seed, "common": common}
    if recipe is not None:
        key["recipe"] = recipe
    return json.dumps(key, sort_keys=True)


def find_run(
    runs: dict, stream: str, policy: dict, seed: int, common: dict, recipe: str, overrides: dict
) -> dict | None:
    """The cached record of a run; the old recipe's also under its key from before recipes existed (issue 43's
    runs: no replay and each stage's own validation share were then the only recipe)."""
    record = runs.get(run_key(stream, policy, seed, common, overrides))
    if record is None and recipe == "old":
        record = runs.get(run_key(stream, policy, seed, common))
    return record


def table_file(stream: str, seed: int, examples: int) -> Path:
    """The .npz table of a :data:`TABLE_STREAMS` stream: its first ``examples`` examples of ``seed``, written once
    (to the temporary folder; atomically, so two workers may race)."""
    import itertools

    import numpy as np

    path = Path(tempfile.gettempdir()) / "alma-bench-long-stream" / f"{stream}-seed{seed}-{examples}.npz"
    if path.exists():
        return path
    pairs = list(itertools.islice(TABLE_STREAMS[stream](seed), examples))
    names = list(pairs[0][0])
    x = np.array([[float(example[n]) for n in names] for example, _ in pairs], dtype=np.float32)
    y = np.array([int(label) for _, label in pairs], dtype=np.int64)
    path.parent.mkdir(parents=True, exist_ok=True)
    part = path.with_suffix(f".{os.getpid()}.npz")
    np.savez(part, x=x, y=y)
    os.replace(part, path)
    return path


def stream_values(stream: str, seed: int, common: dict) -> dict:
    """The config values of ``stream``: a registry stream's, or a table's in place of River's keys."""
    if stream not in TABLE_STREAMS:
        return {**common, **STREAMS[stream][0]}
    values = {k: v for k, v in common.items() if k not in ("dataset.name", "dataset.river_examples")}
    path = table_file(stream, seed, common["dataset.river_examples"])
    return {**values, "dataset.name": "table", "dataset.files": [str(path)]}


def run_one(
    stream: str,
    policy: dict,
    seed: int,
    common: dict,
    keep_series: bool,
    recipe: str = "new",
    overrides: dict | None = None,
) -> dict:
    """One simulated stream (in a worker process when ``--jobs`` > 1); returns its compact record."""
    import torch

    from alma_daemon.config import build_config
    from alma_daemon.observability.measure_words import cumulative_key
    from alma_daemon.observability.served_measure import longest_wait, served_measure
    from alma_daemon.research.run_pool import simulate_on_one_thread

    values = {**stream_values(stream, seed, common), **(overrides or {}), **policy, "seed": seed, "stream.seed": seed}
    config = build_config({}, [f"{key}={json.dumps(value)}" for key, value in values.items()])
    start = time.perf_counter()
    results = simulate_on_one_thread(config)
    series, summary = results["series"], results["summary"]
    measure = summary["measure"]
    record = {
        "stream": stream,
        "policy": label(policy),
        "recipe": recipe,
        "seed": seed,
        "torch": torch.__version__,
        "measure": measure,
        "served": served_measure(series, measure),
        "cumulative": summary[cumulative_key(measure)],
        "final_test": summary[f"final_test_{measure}"],
        "cumulative_train_flops": summary["cumulative_train_flops"],
        "stages": summary["stages"],
        "forced_stages": sum(1 for r in series if r["trained"] and r["reason"].startswith("freshness bound")),
        "longest_wait": longest_wait(series),
        # The River linear reference learned prequentially beside the network (None where none ran).
        "served_reference": summary.get(f"served_reference_{measure}"),
        "cumulative_reference": summary.get(f"cumulative_reference_{measure}"),
        "seconds": round(time.perf_counter() - start, 1),
    }
    if keep_series:
        record["window"] = [round(r[f"prequential_window_{measure}"], 4) for r in series]
        record["trained_at"] = [r["t"] for r in series if r["trained"]]
    return record


# -- report ---------------------------------------------------------------------------------------
def summarize(
    runs: dict, streams: list[str], policies: list[dict], seeds: list[int], common: dict, chosen: dict[str, dict]
) -> dict:
    """Per stream and recipe (``chosen``: name -> overrides): each policy's means over the seeds (None where a
    run is missing) and the verdicts; per stream, the recipes side by side (:func:`comparison`)."""
    report = {}
    for stream in streams:
        by_recipe = {}
        for recipe, overrides in chosen.items():
            rows: dict[str, dict | None] = {}
            for policy in policies:
                records = [find_run(runs, stream, policy, seed, common, recipe, overrides) for seed in seeds]
                rows[label(policy)] = None if any(r is None for r in records) else summary_row(policy, records)
            by_recipe[recipe] = {"overrides": overrides, "policies": rows, "verdicts": verdicts(rows)}
        report[stream] = {"what": STREAMS[stream][1], "recipes": by_recipe, "comparison": comparison(by_recipe)}
    return report


def as_written(report: dict) -> dict:
    """The report as the JSON file holds it: with one recipe, each stream's policies and verdicts at its top
    (as before recipes existed, with the recipe named); with several, by recipe beside their comparison."""
    written = {}
    for stream, entry in report.items():
        if len(entry["recipes"]) > 1:
            written[stream] = entry
            continue
        ((recipe, by_recipe),) = entry["recipes"].items()
        written[stream] = {"what": entry["what"], "recipe": recipe, **by_recipe}
    return written


def summary_row(policy: dict, records: list[dict]) -> dict:
    references = [r.get("served_reference") for r in records]
    return {
        "schedule": is_schedule(policy),
        # The freshness bound, in chunks or examples (None: unbounded).
        "bound": policy.get("policy.max_model_age_chunks", policy.get("policy.max_model_age_examples")),
        "measure": records[0]["measure"],
        "served": statistics.fmean(r["served"] for r in records),
        "served_per_seed": [r["served"] for r in records],
        "served_reference": None if None in references else statistics.fmean(references),
        "served_reference_per_seed": references,
        "cumulative": statistics.fmean(r["cumulative"] for r in records),
        "cumulative_per_seed": [r["cumulative"] for r in records],
        "final_test": statistics.fmean(r["final_test"] for r in records),
        "flops": statistics.fmean(r["cumulative_train_flops"] for r in records),
        "flops_per_seed": [r["cumulative_train_flops"] for r in records],
        "stages": statistics.fmean(r["stages"] for r in records),
        "forced_stages": statistics.fmean(r["forced_stages"] for r in records),
        "longest_wait": max(r["longest_wait"] for r in records),
        "seconds": sum(r["seconds"] for r in records),
    }


def comparison(by_recipe: dict) -> dict:
    """The recipes side by side: each policy's served measure and FLOPs under each, the best schedule (by served
    measure) under each and over all of them, and the River linear reference's served measure."""
    names = list(next(iter(by_recipe.values()))["policies"])
    policies = {name: {recipe: entry["policies"][name] for recipe, entry in by_recipe.items()} for name in names}
    best = {}
    for recipe, entry in by_recipe.items():
        schedules = {n: r for n, r in entry["policies"].items() if r is not None and r["schedule"]}
        if schedules:
            name = min(schedules, key=lambda n: schedules[n]["served"])
            best[recipe] = {"policy": name, "served": schedules[name]["served"], "flops": schedules[name]["flops"]}
    overall = min(best.items(), key=lambda item: item[1]["served"], default=None)
    references = [
        row["served_reference"]
        for entry in by_recipe.values()
        for row in entry["policies"].values()
        if row is not None and row["served_reference"] is not None
    ]
    return {
        "policies": {
            name: {
                recipe: None if row is None else {k: row[k] for k in ("served", "flops", "stages", "final_test")}
                for recipe, row in rows.items()
            }
            for name, rows in policies.items()
        },
        "best schedule": best,
        "best schedule over the recipes": None if overall is None else {"recipe": overall[0], **overall[1]},
        # The reference learns every example whatever the policy: the same on every run of a seed.
        "served_reference": statistics.fmean(references) if references else None,
        "served_reference_spread": (min(references), max(references)) if references else None,
    }


def outcomes(rows: dict) -> list[Outcome]:
    unit = f"served {next(iter(rows.values()))['measure']}"
    return [
        Outcome(
            name, tuple(row["served_per_seed"]), tuple(row["flops_per_seed"]), row["schedule"], unit=unit, decimals=4
        )
        for name, row in rows.items()
    ]


def verdicts(rows: dict) -> dict | None:
    """Each policy against the best schedule by served measure (None until every run is done): the goal
    of issue 43 is a served measure at or below it at no more FLOPs."""
    if any(row is None for row in rows.values()):
        return None
    by_cer = min((name for name, row in rows.items() if row["schedule"]), key=lambda n: rows[n]["cumulative"])
    result = {"best schedule by CER": by_cer}
    for regret in regrets(outcomes(rows)):
        at_or_below = regret.difference <= 0
        within_noise = regret.difference <= 2 * (regret.standard_error or 0)
        no_more_flops = regret.flops_ratio <= 1.0
        within = regret.cer_ratio <= 1 + SERVED_TOLERANCE
        affordable = regret.flops_ratio <= FLOPS_TOLERANCE
        result[regret.policy] = {
            "best": regret.best,
            "served_ratio": regret.cer_ratio,
            "difference": regret.difference,
            "standard_error": regret.standard_error,
            "flops_ratio": regret.flops_ratio,
            "beaten_by": regret.beaten_by,
            "line": regret.line(),
            "served at or below the best schedule's": at_or_below,
            "served within 2 standard errors of it": within_noise,
            "no more FLOPs": no_more_flops,
            "met": at_or_below and no_more_flops,
            f"served within {SERVED_TOLERANCE:.0%} of it at <= {FLOPS_TOLERANCE:g}x its FLOPs": within and affordable,
        }
    return result


def markdown(report: dict, meta: dict) -> str:
    lines = [
        "# Long streams: the policies judged by the error users saw",
        "",
        f"`{meta['command']}`  ",
        f"{meta['machine']}; seeds {meta['seeds']}; {meta['common']}",
        "",
        "served: the mean prequential measure over the second half of the stream (each chunk measured when it "
        "arrived, before training on it). cumulative: the CER (the test measure summed over the chunks). "
        "longest wait: the most chunks in a row without a stage, over the seeds. forced: stages the freshness "
        "bound forced (mean).",
        "",
    ]
    if len(meta["recipes"]) > 1:
        lines += recipe_section(report, meta)
    for stream, entry in report.items():
        for recipe, by_recipe in entry["recipes"].items():
            title = f"## {stream}: {entry['what']}"
            lines += [f"{title}; recipe {recipe} ({recipe_words(recipe, by_recipe['overrides'])})", ""]
            lines += policy_table(by_recipe["policies"])
            lines += verdict_lines(by_recipe["verdicts"])
    return "\n".join(lines)


def recipe_words(recipe: str, overrides: dict) -> str:
    what = RECIPES[recipe][1] if recipe in RECIPES else "the new recipe"
    return what + (f": {', '.join(f'{k}={v}' for k, v in overrides.items())}" if overrides else "")


def recipe_section(report: dict, meta: dict) -> list[str]:
    """Per stream, each policy's served measure and FLOPs under each recipe, the best schedules, the River
    linear reference, and the judgement of each bounded adaptive policy against the best schedule."""
    names = list(meta["recipes"])
    lines = ["# The recipes side by side", ""]
    lines += [f"- {name}: {recipe_words(name, overrides)}" for name, overrides in meta["recipes"].items()]
    lines += [
        "",
        "served: mean over the seeds (lower is better); FLOPs: the training FLOPs; x: the served measure under "
        f"the recipe / under {names[0]}. The River linear reference learns every example prequentially beside the "
        "network, whatever the policy and the recipe.",
        "",
    ]
    for stream, entry in report.items():
        compared = entry["comparison"]
        header = ["policy", *[f"served {n}" for n in names], *[f"x {n}" for n in names[1:]]]
        header += [f"FLOPs {n}" for n in names] + [f"stages {n}" for n in names]
        lines += [f"## {stream}: {entry['what']}", "", "| " + " | ".join(header) + " |"]
        lines.append("|---|" + "---:|" * (len(header) - 1))
        for policy, rows in compared["policies"].items():
            cells = [policy]
            cells += ["not run" if rows[n] is None else f"{rows[n]['served']:.4f}" for n in names]
            first = rows[names[0]]
            cells += [
                "" if rows[n] is None or first is None else f"{rows[n]['served'] / first['served']:.3f}"
                for n in names[1:]
            ]
            cells += ["" if rows[n] is None else f"{rows[n]['flops']:.3g}" for n in names]
            cells += ["" if rows[n] is None else f"{rows[n]['stages']:.1f}" for n in names]
            lines.append("| " + " | ".join(cells) + " |")
        lines.append("")
        reference = compared["served_reference"]
        if reference is not None:
            low, high = compared["served_reference_spread"]
            spread = (
                "the same in every policy's and recipe's runs"
                if round(low, 6) == round(high, 6)
                else f"{low:.4f} to {high:.4f} over the policies and recipes"
            )
            lines.append(
                f"River linear reference (prequential, beside the network): served {reference:.4f} ({spread})."
            )
        for recipe, best in compared["best schedule"].items():
            lines.append(
                f"Best fixed schedule, recipe {recipe}: {best['policy']} (served {best['served']:.4f}, "
                f"FLOPs {best['flops']:.3g})."
            )
        overall = compared["best schedule over the recipes"]
        if overall is not None and len(compared["best schedule"]) > 1:
            lines.append(f"Best fixed schedule over the recipes: {overall['policy']}, recipe {overall['recipe']}.")
        lines.append("")
        for recipe, by_recipe in entry["recipes"].items():
            judged = by_recipe["verdicts"]
            if judged is None:
                lines.append(f"- recipe {recipe}: not all runs done.")
                continue
            for name, verdict in judged.items():
                if not isinstance(verdict, dict) or not name.startswith("adaptive"):
                    continue
                goal = next(k for k in verdict if k.startswith("served within") and "at <=" in k)
                se = verdict["standard_error"]
                lines.append(
                    f"- recipe {recipe}, {name}: served x{verdict['served_ratio']:.3f} "
                    f"({verdict['difference']:+.4f}{'' if se is None else f' +- {se:.4f}'} paired over the seeds), "
                    f"FLOPs x{verdict['flops_ratio']:.2f} of {verdict['best']}'s; {goal}: "
                    f"{'yes' if verdict[goal] else 'NO'}."
                )
        lines.append("")
    return lines


def policy_table(rows: dict) -> list[str]:
    lines = [
        "| policy | served (mean) | served per seed | reference served | cumulative | final test | training FLOPs | "
        "stages | forced | longest wait |",
        "|---|---:|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for name, row in rows.items():
        if row is None:
            lines.append(f"| {name} | not run | | | | | | | | |")
            continue
        seeds = ", ".join(f"{v:.4f}" for v in row["served_per_seed"])
        reference = "" if row.get("served_reference") is None else f"{row['served_reference']:.4f}"
        lines.append(
            f"| {name} | {row['served']:.4f} | {seeds} | {reference} | {row['cumulative']:.2f} | "
            f"{row['final_test']:.4f} | {row['flops']:.3g} | {row['stages']:.1f} | {row['forced_stages']:.1f} | "
            f"{row['longest_wait']} |"
        )
    lines.append("")
    return lines


def verdict_lines(judged: dict | None) -> list[str]:
    if judged is None:
        return ["Verdicts: not all runs done.", ""]
    lines = [f"Best schedule by CER: {judged['best schedule by CER']}.", ""]
    for verdict in judged.values():
        if not isinstance(verdict, dict):
            continue
        checks = {k: v for k, v in verdict.items() if isinstance(v, bool) and k != "met"}
        text = "; ".join(f"{k}: {'yes' if v else 'NO'}" for k, v in checks.items())
        lines.append(f"- {verdict['line']}. {text}. Goal {'met' if verdict['met'] else 'MISSED'}.")
    lines.append("")
    return lines


def in_series_figure(policy: dict) -> bool:
    """Whether the series figure shows ``policy`` (the cache keeps the series of these alone): fixed w=5 (the
    issue's plain wait), geometric 0.5 and adaptive with its default detector, without and with each bound.
    Bounded geometric is left out: its line lies on bounded adaptive's wherever adaptive sees no drift."""
    name = policy["policy.name"]
    if name == "fixed":
        return policy["policy.wait"] == 5
    if name == "geometric":
        return "policy.max_model_age_chunks" not in policy
    return name == "adaptive" and "policy.drift_detector" not in policy


def series_figure(
    runs: dict, streams: list[str], policies: list[dict], seed: int, common: dict, path: Path, recipe: tuple[str, dict]
) -> bool:
    """The windowed prequential measure along each stream (one seed), stages marked below."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    shown = [p for p in policies if in_series_figure(p)]
    if not shown:
        return False
    records = {s: [find_run(runs, s, p, seed, common, *recipe) for p in shown] for s in streams}
    if any(r is None or "window" not in r for rs in records.values() for r in rs):
        return False
    fig, axes = plt.subplots(
        2, len(streams), figsize=(6 * len(streams), 5.5), sharex=True, gridspec_kw={"height_ratios": [3, 1]}
    )
    for column, stream in enumerate(streams):
        top, bottom = (axes[0], axes[1]) if len(streams) == 1 else (axes[0][column], axes[1][column])
        for row, record in enumerate(records[stream]):
            t = range(1, len(record["window"]) + 1)
            (line,) = top.plot(t, record["window"], lw=1.0, label=f"{record['policy']} (served {record['served']:.3f})")
            bottom.scatter(
                record["trained_at"], [row] * len(record["trained_at"]), marker="|", s=60, color=line.get_color()
            )
        measure = records[stream][0]["measure"]
        top.axvline(len(records[stream][0]["window"]) / 2, color="grey", lw=0.6, ls=":")
        top.set_ylabel(f"prequential {measure}, last {common['stream.prequential_window']} chunks")
        top.set_yscale("log")
        top.set_title(f"{STREAMS[stream][1]}, seed {seed}", fontsize=9)
        top.legend(fontsize=7)
        bottom.set_yticks(range(len(records[stream])), [r["policy"] for r in records[stream]], fontsize=7)
        bottom.set_ylim(-0.5, len(records[stream]) - 0.5)
        bottom.set_xlabel("chunk (stages marked; served: the mean right of the dotted line)")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


def served_figure(report: dict, seeds: list[int], path: Path) -> None:
    """Each policy's served measure as a share of the best schedule's, one panel per stream, with the
    paired standard error of the difference over the seeds."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    streams = {s: e for s, e in report.items() if e["verdicts"] is not None}
    fig, axes = plt.subplots(1, len(streams), figsize=(6 * len(streams), 6.5), sharey=True, squeeze=False)
    for ax, entry in zip(axes[0], streams.values(), strict=True):
        rows = entry["policies"]
        judged = entry["verdicts"]
        best = rows[next(v["best"] for v in judged.values() if isinstance(v, dict))]
        names = list(rows)
        for y, name in enumerate(names):
            row = rows[name]
            difference, spread = paired_difference(tuple(row["served_per_seed"]), tuple(best["served_per_seed"]))
            color = "grey" if row["schedule"] else ("tab:blue" if row["bound"] is not None else "tab:red")
            ax.errorbar(
                1 + difference / best["served"],
                y,
                xerr=2 * (spread or 0) / best["served"],
                fmt="o",
                color=color,
                markersize=4,
                capsize=2,
            )
        ax.axvline(1, color="grey", lw=0.8, ls="--")
        ax.set_yticks(range(len(names)), names, fontsize=7)
        ax.set_xlabel(f"served {best['measure']} / the best schedule's (bars: 2 paired standard errors)", fontsize=8)
        ax.set_title(f"{entry['what']}\nseeds {seeds}", fontsize=9)
        ax.grid(axis="x", alpha=0.3)
    axes[0][0].invert_yaxis()  # the axes share it: once for all
    fig.suptitle(
        "grey: schedules; red: policies without a bound; blue: with policy.max_model_age_chunks or _examples",
        fontsize=8,
    )
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def shown_path(path: Path) -> str:
    """``path`` relative to the repository when inside it, as the re-run command gives it."""
    root = Path(__file__).resolve().parents[1]
    return str(path.resolve().relative_to(root)) if path.resolve().is_relative_to(root) else str(path)


def run_missing(tasks: list[PoolRun], cache: RecordFile, jobs: int) -> None:
    _, todo = resume(tasks, cache)
    if not todo:
        return
    print(f"{len(todo)} run(s) to do, {jobs} at a time")
    run_each(
        todo, cache, jobs=jobs, on_done=_say_record, on_failed=lambda run, exc: print(f"FAILED {run.key}: {exc!r}")
    )


def _say_record(run: PoolRun, record: dict) -> None:
    print(
        f"{record['stream']:11} {record['policy']:32} {record.get('recipe', 'old'):16} seed {record['seed']}: "
        f"served {record['served']:.4f}  "
        f"cumulative {record['cumulative']:9.2f}  FLOPs {record['cumulative_train_flops']:.3g}  "
        f"stages {record['stages']:4}  longest wait {record['longest_wait']:4}  reference "
        f"{record.get('served_reference') or float('nan'):.4f}  {record['seconds']} s",
        flush=True,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "--streams",
        nargs="+",
        default=["hyperplane", "friedman"],
        choices=list(STREAMS),
        help="default: hyperplane friedman",
    )
    parser.add_argument("--seeds", nargs="+", type=int, default=[2, 3, 4, 5])
    parser.add_argument("--waits", nargs="+", type=int, default=WAITS, help="the fixed schedules' waits")
    parser.add_argument(
        "--bounds", nargs="*", type=int, default=[10, 25], help="policy.max_model_age_chunks of the bounded policies"
    )
    parser.add_argument(
        "--example-bounds",
        nargs="*",
        type=int,
        default=[],
        help="policy.max_model_age_examples of the bounded policies (geometric's, adaptive's, forecast's)",
    )
    parser.add_argument(
        "--detectors",
        nargs="*",
        default=["page_hinkley"],
        choices=["page_hinkley", "adwin"],
        help="also run adaptive with each policy.drift_detector, without and with each bound",
    )
    parser.add_argument(
        "--policies",
        nargs="+",
        default=POLICIES,
        choices=POLICIES,
        help="which of geometric 0.5 (a schedule, and bounded), adaptive and forecast to run (default: all)",
    )
    parser.add_argument(
        "--recipes",
        nargs="+",
        default=["new"],
        choices=list(RECIPES),
        help="run every configuration under each stage recipe (default: new, issue 50's; old: no replay, "
        "each stage's own validation share)",
    )
    parser.add_argument(
        "--replay-examples",
        nargs="*",
        type=int,
        default=[],
        help="also run the new recipe with a replay set of each of these many examples (stream.replay_examples)",
    )
    parser.add_argument(
        "--stage-examples",
        nargs="*",
        type=int,
        default=[],
        help="also run the new recipe with stages of at least each of these many examples (stream.stage_examples)",
    )
    parser.add_argument("--chunks", type=int, default=2000, help="stream.megabatches (default 2000)")
    parser.add_argument("--chunk-examples", type=int, default=100, help="examples a chunk (default 100)")
    parser.add_argument("--width", type=int, default=32, help="learner.width of the SM MLP (default 32)")
    parser.add_argument("--epochs", type=int, default=3, help="train.epochs (default 3; no early stop before)")
    parser.add_argument("--test-examples", type=int, default=2000, help="dataset.test_examples (default 2000)")
    parser.add_argument("--jobs", type=int, default=1, help="runs in parallel, one torch thread each")
    parser.add_argument("--runs", type=Path, default=RESULTS / "long_stream_runs.json", help="cache of finished runs")
    parser.add_argument("--out", type=Path, default=RESULTS / "long_stream.json")
    parser.add_argument("--figures", type=Path, default=FIGURES, help="folder of the figures (default docs/figures)")
    parser.add_argument("--report-only", action="store_true", help="only rebuild the tables and figures from --runs")
    parser.add_argument("--machine", help="where the cached runs ran, for the report (default: this machine)")
    args = parser.parse_args()

    common = {
        "dataset.name": "river",
        "dataset.river_examples": river_examples(args.chunks, args.chunk_examples),
        "dataset.test_examples": args.test_examples,
        "stream.megabatches": args.chunks,
        "stream.prequential_window": 50,
        "learner.name": "sm",
        "learner.width": args.width,
        "train.epochs": args.epochs,
    }
    policies = grid(args.waits, args.bounds, args.detectors, args.policies, args.example_bounds)
    chosen = recipes(args.recipes, args.replay_examples, args.stage_examples)
    cache = RecordFile(args.runs)
    if not args.report_only:
        tasks = [
            PoolRun(
                run_key(stream, policy, seed, common, overrides),
                run_one,
                (stream, policy, seed, common, seed == args.seeds[0] and in_series_figure(policy), recipe, overrides),
            )
            for recipe, overrides in chosen.items()
            for seed in args.seeds
            for stream in args.streams
            for policy in policies
        ]
        run_missing(tasks, cache, args.jobs)
    runs = cache.records

    report = summarize(runs, args.streams, policies, args.seeds, common, chosen)
    stem = args.out.stem.replace("_", "-")
    versions = sorted({r.get("torch", "?") for r in runs.values()})
    meta = {
        "command": "nice python benchmarks/bench_long_stream.py "
        + " ".join(
            [
                f"--recipes {' '.join(args.recipes)}",
                *([f"--replay-examples {' '.join(map(str, args.replay_examples))}"] if args.replay_examples else []),
                *([f"--stage-examples {' '.join(map(str, args.stage_examples))}"] if args.stage_examples else []),
                f"--streams {' '.join(args.streams)}",
                f"--policies {' '.join(args.policies)}",
                f"--seeds {' '.join(map(str, args.seeds))}",
                f"--bounds {' '.join(map(str, args.bounds))}",
                *([f"--example-bounds {' '.join(map(str, args.example_bounds))}"] if args.example_bounds else []),
                f"--waits {' '.join(map(str, args.waits))}",
                f"--detectors {' '.join(args.detectors)}",
                f"--chunks {args.chunks} --chunk-examples {args.chunk_examples}",
                f"--width {args.width} --epochs {args.epochs} --test-examples {args.test_examples}",
                f"--runs {shown_path(args.runs)} --out {shown_path(args.out)}",
            ]
        ),
        "machine": f"{args.machine or f'{platform.machine()}, {os.cpu_count()} cores'}, torch {', '.join(versions)} "
        "(CPU, one thread per run)",
        "seeds": args.seeds,
        "common": common,
        "recipes": chosen,
        "run_seconds": round(
            sum(
                row["seconds"]
                for e in report.values()
                for r in e["recipes"].values()
                for row in r["policies"].values()
                if row is not None
            ),
            1,
        ),
    }
    args.out.write_text(json.dumps({"meta": meta, "streams": as_written(report)}, indent=1))
    table = markdown(report, meta)
    args.out.with_suffix(".md").write_text(table + "\n")
    print(table)
    for recipe, overrides in chosen.items():
        suffix = "" if len(chosen) == 1 else "-" + "".join(c if c.isalnum() else "-" for c in recipe).replace("--", "-")
        path = args.figures / f"{stem}{suffix}.png"
        if series_figure(runs, args.streams, policies, args.seeds[0], common, path, (recipe, overrides)):
            print(f"figure: {path}")
        judged = {s: {"what": e["what"], **e["recipes"][recipe]} for s, e in report.items()}
        if any(entry["verdicts"] is not None for entry in judged.values()):
            path = args.figures / f"{stem}{suffix}-served.png"
            served_figure(judged, args.seeds, path)
            print(f"figure: {path}")


if __name__ == "__main__":
    main()
