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

    nice python benchmarks/bench_long_stream.py --seeds 0 1 --bounds 5 10 25 50 --detectors page_hinkley adwin --out benchmarks/results/long_stream_tune.json --jobs 2
    nice python benchmarks/bench_long_stream.py --seeds 2 3 4 5 --bounds 10 25 --detectors page_hinkley --jobs 2
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import time
from pathlib import Path

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
}
WAITS = [1, 2, 5, 10, 20, 50]


def label(policy: dict) -> str:
    detector = policy.get("policy.drift_detector")
    age = policy.get("policy.max_model_age_chunks")
    text = policy_label(policy) + (f" {detector}" if detector is not None else "")
    return text + (f", age <= {age}" if age is not None else "")


def grid(waits: list[int], bounds: list[int], detectors: list[str]) -> list[dict]:
    """The schedules, then geometric 0.5, adaptive and forecast without and with each freshness bound,
    then adaptive with each other drift detector (do the sequential tests see a model going stale?),
    without and with each bound."""
    schedules = [{"policy.name": "fixed", "policy.wait": w} for w in waits]
    schedules.append({"policy.name": "geometric", "policy.ratio": 0.5})
    bounded = [{"policy.name": "geometric", "policy.ratio": 0.5, "policy.max_model_age_chunks": b} for b in bounds]
    for name in ("adaptive", "forecast"):
        bounded += [{"policy.name": name}]
        bounded += [{"policy.name": name, "policy.max_model_age_chunks": b} for b in bounds]
    detecting = [
        {"policy.name": "adaptive", "policy.drift_detector": d, **({"policy.max_model_age_chunks": b} if b else {})}
        for d in detectors
        for b in [None, *bounds]
    ]
    return schedules + bounded + detecting


def is_schedule(policy: dict) -> bool:
    """A schedule in hindsight: it reads nothing of the stream and has no bound."""
    return policy["policy.name"] in SCHEDULES and "policy.max_model_age_chunks" not in policy


def river_examples(chunks: int, chunk_examples: int) -> int:
    """Examples to read so that ``chunks`` chunks of ``chunk_examples`` arrive, the tenth after them the test set."""
    train = chunks * chunk_examples
    return train + train // 9


def run_key(stream: str, policy: dict, seed: int, common: dict) -> str:
    return json.dumps({"stream": stream, "policy": policy, "seed": seed, "common": common}, sort_keys=True)


def run_one(stream: str, policy: dict, seed: int, common: dict, keep_series: bool) -> dict:
    """One simulated stream (in a worker process when ``--jobs`` > 1); returns its compact record."""
    import torch

    from alma_daemon.config import build_config
    from alma_daemon.observability.measure_words import cumulative_key
    from alma_daemon.observability.served_measure import longest_wait, served_measure
    from alma_daemon.research.run_pool import simulate_on_one_thread

    values = {**common, **STREAMS[stream][0], **policy, "seed": seed, "stream.seed": seed}
    config = build_config({}, [f"{key}={json.dumps(value)}" for key, value in values.items()])
    start = time.perf_counter()
    results = simulate_on_one_thread(config)
    series, summary = results["series"], results["summary"]
    measure = summary["measure"]
    record = {
        "stream": stream,
        "policy": label(policy),
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
        "seconds": round(time.perf_counter() - start, 1),
    }
    if keep_series:
        record["window"] = [round(r[f"prequential_window_{measure}"], 4) for r in series]
        record["trained_at"] = [r["t"] for r in series if r["trained"]]
    return record


# -- report ---------------------------------------------------------------------------------------
def summarize(runs: dict, streams: list[str], policies: list[dict], seeds: list[int], common: dict) -> dict:
    """Per stream: each policy's means over the seeds (None where a run is missing) and the verdicts."""
    report = {}
    for stream in streams:
        rows: dict[str, dict | None] = {}
        for policy in policies:
            records = [runs.get(run_key(stream, policy, seed, common)) for seed in seeds]
            if any(r is None for r in records):
                rows[label(policy)] = None
                continue
            rows[label(policy)] = {
                "schedule": is_schedule(policy),
                "bound": policy.get("policy.max_model_age_chunks"),
                "measure": records[0]["measure"],
                "served": statistics.fmean(r["served"] for r in records),
                "served_per_seed": [r["served"] for r in records],
                "cumulative": statistics.fmean(r["cumulative"] for r in records),
                "cumulative_per_seed": [r["cumulative"] for r in records],
                "final_test": statistics.fmean(r["final_test"] for r in records),
                "flops": statistics.fmean(r["cumulative_train_flops"] for r in records),
                "flops_per_seed": [r["cumulative_train_flops"] for r in records],
                "stages": statistics.fmean(r["stages"] for r in records),
                "forced_stages": statistics.fmean(r["forced_stages"] for r in records),
                "longest_wait": max(r["longest_wait"] for r in records),
            }
        report[stream] = {"what": STREAMS[stream][1], "policies": rows, "verdicts": verdicts(rows)}
    return report


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
        result[regret.policy] = {
            "best": regret.best,
            "difference": regret.difference,
            "standard_error": regret.standard_error,
            "flops_ratio": regret.flops_ratio,
            "beaten_by": regret.beaten_by,
            "line": regret.line(),
            "served at or below the best schedule's": at_or_below,
            "served within 2 standard errors of it": within_noise,
            "no more FLOPs": no_more_flops,
            "met": at_or_below and no_more_flops,
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
    for stream, entry in report.items():
        lines += [f"## {stream}: {entry['what']}", ""]
        rows = entry["policies"]
        lines += [
            "| policy | served (mean) | served per seed | cumulative | final test | training FLOPs | stages | "
            "forced | longest wait |",
            "|---|---:|---|---:|---:|---:|---:|---:|---:|",
        ]
        for name, row in rows.items():
            if row is None:
                lines.append(f"| {name} | not run | | | | | | | |")
                continue
            seeds = ", ".join(f"{v:.4f}" for v in row["served_per_seed"])
            lines.append(
                f"| {name} | {row['served']:.4f} | {seeds} | {row['cumulative']:.2f} | {row['final_test']:.4f} | "
                f"{row['flops']:.3g} | {row['stages']:.1f} | {row['forced_stages']:.1f} | {row['longest_wait']} |"
            )
        lines.append("")
        judged = entry["verdicts"]
        if judged is None:
            lines += ["Verdicts: not all runs done.", ""]
            continue
        lines += [f"Best schedule by CER: {judged['best schedule by CER']}.", ""]
        for verdict in judged.values():
            if not isinstance(verdict, dict):
                continue
            checks = {k: v for k, v in verdict.items() if isinstance(v, bool) and k != "met"}
            text = "; ".join(f"{k}: {'yes' if v else 'NO'}" for k, v in checks.items())
            lines.append(f"- {verdict['line']}. {text}. Goal {'met' if verdict['met'] else 'MISSED'}.")
        lines.append("")
    return "\n".join(lines)


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


def series_figure(runs: dict, streams: list[str], policies: list[dict], seed: int, common: dict, path: Path) -> bool:
    """The windowed prequential measure along each stream (one seed), stages marked below."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    shown = [p for p in policies if in_series_figure(p)]
    records = {s: [runs.get(run_key(s, p, seed, common)) for p in shown] for s in streams}
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
    fig.suptitle("grey: schedules; red: policies without a bound; blue: with policy.max_model_age_chunks", fontsize=8)
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
        f"{record['stream']:11} {record['policy']:32} seed {record['seed']}: served {record['served']:.4f}  "
        f"cumulative {record['cumulative']:9.2f}  FLOPs {record['cumulative_train_flops']:.3g}  "
        f"stages {record['stages']:4}  longest wait {record['longest_wait']:4}  {record['seconds']} s",
        flush=True,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--streams", nargs="+", default=list(STREAMS), choices=list(STREAMS))
    parser.add_argument("--seeds", nargs="+", type=int, default=[2, 3, 4, 5])
    parser.add_argument("--waits", nargs="+", type=int, default=WAITS, help="the fixed schedules' waits")
    parser.add_argument(
        "--bounds", nargs="*", type=int, default=[10, 25], help="policy.max_model_age_chunks of the bounded policies"
    )
    parser.add_argument(
        "--detectors",
        nargs="*",
        default=["page_hinkley"],
        choices=["page_hinkley", "adwin"],
        help="also run adaptive with each policy.drift_detector, without and with each bound",
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
    policies = grid(args.waits, args.bounds, args.detectors)
    cache = RecordFile(args.runs)
    if not args.report_only:
        tasks = [
            PoolRun(
                run_key(stream, policy, seed, common),
                run_one,
                (stream, policy, seed, common, seed == args.seeds[0] and in_series_figure(policy)),
            )
            for seed in args.seeds
            for stream in args.streams
            for policy in policies
        ]
        run_missing(tasks, cache, args.jobs)
    runs = cache.records

    report = summarize(runs, args.streams, policies, args.seeds, common)
    stem = args.out.stem.replace("_", "-")
    versions = sorted({r.get("torch", "?") for r in runs.values()})
    meta = {
        "command": "nice python benchmarks/bench_long_stream.py "
        + " ".join(
            [
                f"--streams {' '.join(args.streams)}",
                f"--seeds {' '.join(map(str, args.seeds))}",
                f"--bounds {' '.join(map(str, args.bounds))}",
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
    }
    args.out.write_text(json.dumps({"meta": meta, "streams": report}, indent=1))
    table = markdown(report, meta)
    args.out.with_suffix(".md").write_text(table + "\n")
    print(table)
    path = args.figures / f"{stem}.png"
    if series_figure(runs, args.streams, policies, args.seeds[0], common, path):
        print(f"figure: {path}")
    if any(entry["verdicts"] is not None for entry in report.values()):
        path = args.figures / f"{stem}-served.png"
        served_figure(report, args.seeds, path)
        print(f"figure: {path}")


if __name__ == "__main__":
    main()
