"""Rare fraud with a changing rule (issue 50): alma-daemon's backtest against offline models on the same rows.

Per history seed, ``examples/table/make_transactions.py --rare --seed S`` writes a history to a temporary
folder (30,000 card transactions over 60 days, 12 skewed features, about 0.7 % fraud, a new fraud rule
from day 30, the rows shuffled), and:

- **alma-daemon** backtests it with ``examples/table/fraud-rare.yaml`` (cost 50 per fraud missed and 1
  per false alarm, class weights 1:50, 10 chunks, the team MLP of examples/custom/tabular.py) through
  ``alma simulate``'s engine, in this process (alma_daemon/research/run_pool.py, one torch thread a run),
  under each configuration of :data:`CONFIGURATIONS`: the example as it is (the one default policy, whose
  freshness bound starts a stage at every chunk of 2,700), adaptive and forecast without the bound, and a
  nightly retrain from scratch on the whole history so far (the reference). Each gives
  the final model's test PR-AUC, recall, precision and cost (``final_test_measures``, ``final_test_cost``)
  and the cumulative (and mean) prequential cost: every chunk measured before the model trains on it;
- **offline references** get the same chunks and test set as alma cuts them
  (``alma_daemon.research.simulate.simulated_stream``, which reads the history with
  alma_daemon/data/table.py): scikit-learn's ``LogisticRegression`` on standardized features trained on
  the last 1, 2, 3 and 4 chunks before the test set, in two variants (class weights 1:50 at threshold
  0.5, the weights standing in for the costs; and unweighted, its probability thresholded at
  c_fp / (c_fp + c_fn) = 1/51, the cost-optimal decision for a calibrated probability);
  ``HistGradientBoostingClassifier`` on the last 2 chunks (unweighted, threshold 1/51); flagging nothing;
  and a prequential logistic regression (weighted, each chunk predicted by the model trained on the up
  to 3 chunks before it, the first chunk by flagging nothing) for the cumulative prequential cost.

Every alma run also learns a River linear reference (``StandardScaler | LogisticRegression``) prequentially
beside the network, on the same chunks (``reference.kind: auto``); the table reads its cumulative and served
prequential cost from the example's runs (``cumulative_reference_cost``, ``served_reference_cost``) as a
row of its own. The served cost is the mean prequential cost over the second half of the chunks (6-10,
after the new fraud rule). The example trains each stage on its own chunk (no replay), stops early on
the chunk's held-out share, and keeps a linear candidate where it validates better (``train.linear_candidate``);
``window`` is the example before (the last 3 chunks, and a from-scratch candidate), and ``service-recipe``,
``no-linear``, ``scratch`` and ``skew-kept`` change one choice each (a team task's default replay and pooled
validation set; no linear candidate; a from-scratch candidate as well; no power transform of the skewed
features). The example's settings were chosen on history seeds 6-8.

The issue's target, judged on the means over the seeds: the example's test PR-AUC within 10 % of the best
logistic regression's (every variant and window), and its cumulative prequential cost below flagging
nothing's and the River linear reference's (beside it: the nightly retrain's, and the reference's on the
chunks after the first). The seeds (default 1-5) were used to choose no constant: the
generator's constants were set on seed 0 alone, the example's settings on seeds 6-8.

Finished runs are kept in ``--runs`` (a JSON cache by key: seed, the history's and the config file's
digests, the configuration), so an interrupted benchmark resumes; alma's code is not in the key, so after
changing it run with ``--fresh``. ``--report-only`` rebuilds the tables from the cache (without
scikit-learn).

    nice python benchmarks/bench_fraud.py --fresh               # seeds 1-5, every configuration
    nice python benchmarks/bench_fraud.py --quick --fresh       # seed 1, the example and the nightly retrain
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.util
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path
from types import ModuleType
from typing import Any

from alma_daemon.research.run_pool import PoolRun, RecordFile, resume, run_each

ROOT = Path(__file__).resolve().parents[1]
RESULTS = Path(__file__).resolve().parent / "results"
CONFIG = ROOT / "examples" / "table" / "fraud-rare.yaml"
GENERATOR = ROOT / "examples" / "table" / "make_transactions.py"
MISSING_SKLEARN = 'bench_fraud.py needs scikit-learn for its offline references: pip install -e ".[bench]"'

#: name -> (what it is, config overrides by dotted key)
CONFIGURATIONS: dict[str, tuple[str, dict[str, Any]]] = {
    "example": (
        "alma, the example as it is (the one default policy: a stage every chunk, on that chunk alone, a linear "
        "candidate)",
        {},
    ),
    "adaptive": ("alma, adaptive without the freshness bound", {"policy.max_model_age_examples": None}),
    "forecast": (
        "alma, forecast without the freshness bound",
        {"policy.name": "forecast", "policy.max_model_age_examples": None},
    ),
    "window": (
        "alma, each stage on the last 3 chunks with a from-scratch candidate (the example before)",
        {
            "stream.replay": True,
            "stream.replay_keep": "window",
            "stream.replay_examples": 8100,
            "train.scratch_candidate": True,
        },
    ),
    "service-recipe": (
        "alma, the example under a team task's default recipe (class-aware replay, pooled validation set)",
        {"stream.replay": None, "stream.validation_examples": None},
    ),
    "no-linear": (
        "alma, the example without its linear candidate (train.linear_candidate: false)",
        {"train.linear_candidate": False},
    ),
    "scratch": (
        "alma, the example with a from-scratch candidate too (train.scratch_candidate: true)",
        {"train.scratch_candidate": True},
    ),
    "skew-kept": (
        "alma, the example without the skewed features' power transform",
        {"dataset.skewed_features": "keep"},
    ),
    "nightly": (
        "alma, nightly retrain (a stage every chunk, from scratch, on every chunk so far)",
        {"train.from_scratch": True, "train.linear_candidate": False, "stream.replay": True},
    ),
}
QUICK_CONFIGURATIONS = ["example", "nightly"]
#: The windows (chunks before the test set) the logistic regressions train on.
WINDOWS = [1, 2, 3, 4]
#: The windows the team's network trains on offline (:func:`team_network_probability`).
NETWORK_WINDOWS = [2, 4]
#: Bumped when the offline references change, so that cached ones are computed again.
OFFLINE_VERSION = 3
#: The gradient boosting's window and the prequential logistic regression's.
BOOSTING_WINDOW = 2
PREQUENTIAL_WINDOW = 3


def generator() -> ModuleType:
    """examples/table/make_transactions.py (the examples folder is no package on sys.path)."""
    spec = importlib.util.spec_from_file_location("make_transactions", GENERATOR)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def write_history(folder: Path, seed: int) -> tuple[Path, str]:
    """The rare-fraud history of ``seed`` as a CSV in ``folder``, and its digest (for the cache keys)."""
    make = generator()
    path = folder / f"transactions-rare-{seed}.csv"
    make.write_csv(path, make.rare_fraud_transactions(seed))
    return path, hashlib.sha256(path.read_bytes()).hexdigest()[:16]


def fraud_config(history: Path, seed: int, overrides: dict[str, Any]) -> Any:
    """The example's config on ``history``, seeded by ``seed`` (model and stream), with ``overrides``."""
    from alma_daemon.config import build_config, read_yaml

    values = {"dataset.files": [str(history)], "seed": seed, "stream.seed": seed, **overrides}
    return build_config(read_yaml(CONFIG), [f"{key}={json.dumps(value)}" for key, value in values.items()], CONFIG)


def run_key(kind: str, seed: int, digests: dict[str, str]) -> str:
    return json.dumps({"run": kind, "seed": seed, **digests}, sort_keys=True)


# -- alma -----------------------------------------------------------------------------------------------
def run_alma(name: str, history: str, seed: int) -> dict:
    """One backtest of the example under configuration ``name``; its compact record."""
    import torch

    from alma_daemon.research.run_pool import simulate_on_one_thread

    overrides = CONFIGURATIONS[name][1]
    config = fraud_config(Path(history), seed, overrides)
    start = time.perf_counter()
    results = simulate_on_one_thread(config)
    series, summary = results["series"], results["summary"]
    measures = summary.get("final_test_measures") or {}
    return {
        "run": name,
        "seed": seed,
        "torch": torch.__version__,
        "test_pr_auc": measures.get("pr_auc"),
        "test_recall": measures.get("recall"),
        "test_precision": measures.get("precision"),
        "test_cost": summary["final_test_cost"],
        "cumulative_prequential_cost": summary["cumulative_prequential_cost"],
        "mean_prequential_cost": summary["cumulative_prequential_cost"] / summary["chunks"],
        "served_cost": summary.get("served_cost"),
        # The River linear reference learned beside the network on the same chunks (None where none ran).
        "reference": reference_figures(summary, [r.get("reference_cost") for r in series]),
        "stages": summary["stages"],
        "trained_at": [r["t"] for r in series if r["trained"]],
        "prequential_cost": [round(r["prequential_cost"], 4) for r in series],
        "test_cost_series": [round(r["test_cost"], 4) for r in series],
        "test_pr_auc_series": [rounded((r.get("test_measures") or {}).get("pr_auc")) for r in series],
        "cumulative_train_flops": summary["cumulative_train_flops"],
        "seconds": round(time.perf_counter() - start, 1),
    }


def reference_figures(summary: dict, costs: list[float | None]) -> dict | None:
    """The reference learner's prequential figures from a run's summary (None where it recorded none)."""
    cumulative = summary.get("cumulative_reference_cost")
    if cumulative is None:
        return None
    return {
        "cumulative_prequential_cost": cumulative,
        "mean_prequential_cost": cumulative / summary["chunks"],
        "served_cost": summary.get("served_reference_cost"),
        "prequential_cost": [rounded(c) for c in costs],
    }


def rounded(value: float | None) -> float | None:
    return None if value is None else round(value, 4)


# -- offline references ---------------------------------------------------------------------------------
def binary_figures(y: Any, probability: Any, threshold: float, c_fn: float, c_fp: float) -> dict:
    """PR-AUC of ``probability``, and recall, precision and mean cost of flagging where it reaches ``threshold``."""
    import numpy as np
    from sklearn.metrics import average_precision_score

    flagged = probability >= threshold
    positives = y == 1
    caught = int((flagged & positives).sum())
    return {
        "test_pr_auc": float(average_precision_score(y, probability)) if positives.any() else None,
        "test_recall": caught / int(positives.sum()) if positives.any() else None,
        "test_precision": caught / int(flagged.sum()) if flagged.any() else 0.0,
        "test_cost": float(np.mean(c_fn * (positives & ~flagged) + c_fp * (~positives & flagged))),
    }


def offline_references(history: str, seed: int) -> dict:
    """The offline references on the chunks and test set alma cuts from ``history``: name -> figures."""
    import numpy as np
    from sklearn.ensemble import HistGradientBoostingClassifier
    from sklearn.linear_model import LogisticRegression
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler

    from alma_daemon.research.simulate import simulated_stream

    start = time.perf_counter()
    config = fraud_config(Path(history), seed, {})
    stream = simulated_stream(config)
    chunks = [(c.data.x.numpy(), c.data.y.numpy()) for c in stream.chunks]
    assert stream.test is not None
    x_test, y_test = stream.test.x.numpy(), stream.test.y.numpy()
    c_fn, c_fp = config.task.false_negative_cost, config.task.false_positive_cost
    threshold = c_fp / (c_fp + c_fn)
    weights = dict(enumerate(config.task.class_weights)) or None

    def last(k: int, before: int = len(chunks)) -> tuple[Any, Any]:
        window = chunks[max(0, before - k) : before]
        return np.concatenate([x for x, _ in window]), np.concatenate([y for _, y in window])

    def logistic(weighted: bool) -> Any:
        return make_pipeline(
            StandardScaler(), LogisticRegression(class_weight=weights if weighted else None, max_iter=5000)
        )

    figures: dict[str, dict] = {}
    for k in WINDOWS:
        x, y = last(k)
        weighted = logistic(True).fit(x, y).predict_proba(x_test)[:, 1]
        figures[f"lr-weighted-{k}"] = binary_figures(y_test, weighted, 0.5, c_fn, c_fp)
        plain = logistic(False).fit(x, y).predict_proba(x_test)[:, 1]
        figures[f"lr-plain-{k}"] = binary_figures(y_test, plain, threshold, c_fn, c_fp)
    for k in NETWORK_WINDOWS:
        x, y = last(k)
        network = team_network_probability(x, y, x_test, config, seed)
        figures[f"mlp-weighted-{k}"] = binary_figures(y_test, network, 0.5, c_fn, c_fp)
    x, y = last(BOOSTING_WINDOW)
    boosted = HistGradientBoostingClassifier(random_state=seed).fit(x, y).predict_proba(x_test)[:, 1]
    figures[f"hgb-{BOOSTING_WINDOW}"] = binary_figures(y_test, boosted, threshold, c_fn, c_fp)
    nothing = binary_figures(y_test, np.zeros(len(y_test)), 1.0, c_fn, c_fp)
    nothing["test_pr_auc"] = float(y_test.mean())  # an input-blind score: the positives' share
    # Flagging nothing costs c_fn per fraud: each chunk's prequential cost is c_fn times its fraud share.
    nothing_prequential = [c_fn * float(y.mean()) for _, y in chunks]
    figures["nothing"] = {**nothing, **prequential_figures(nothing_prequential)}
    # The prequential logistic regression: chunk t predicted by the model of the chunks before it.
    costs = []
    for t, (x_chunk, y_chunk) in enumerate(chunks):
        x, y = (None, None) if t == 0 else last(PREQUENTIAL_WINDOW, before=t)
        if y is None or not y.any():
            costs.append(c_fn * float(y_chunk.mean()))
            continue
        probability = logistic(True).fit(x, y).predict_proba(x_chunk)[:, 1]
        costs.append(binary_figures(y_chunk, probability, 0.5, c_fn, c_fp)["test_cost"])
    figures[f"lr-prequential-{PREQUENTIAL_WINDOW}"] = prequential_figures(costs)
    return {
        "run": "offline",
        "seed": seed,
        "references": figures,
        "chunk_rows": len(chunks[0][1]),
        "chunk_frauds": [int(y.sum()) for _, y in chunks],
        "test_rows": len(y_test),
        "test_frauds": int(y_test.sum()),
        "seconds": round(time.perf_counter() - start, 1),
    }


def team_network_probability(x: Any, y: Any, x_test: Any, config: Any, seed: int) -> Any:
    """The team's network (``learner.model``: examples/custom/tabular.py) trained offline from scratch on
    ``x``, ``y``, as a careful engineer would train it once: features as alma's model takes them (skewed ones
    through the power transform, then standardized, statistics of the window), the
    example's class weights, Adam at alma's defaults (lr 1e-3, betas 0.9, 0.98), ``train.epochs`` passes
    of ``train.batch_size``; its fraud probabilities on ``x_test``. It tells how much of alma's gap to the
    logistic regression is the network's own on this few frauds, and how much the stream's recipe's."""
    import numpy as np
    import torch

    from alma_daemon.data.task_info import TaskInfo
    from alma_daemon.models.backbones import Normalize
    from alma_daemon.models.user_model import import_factory

    torch.manual_seed(seed)
    # The inputs as alma's model sees them: skewed features through the power transform, then standardized.
    task = TaskInfo(
        "classification", (x.shape[1],), 2, normalization="standardize", skewed_features=config.dataset.skewed_features
    )
    normalize = Normalize(task.with_statistics(torch.tensor(x, dtype=torch.float64)))
    inputs = normalize(torch.tensor(x, dtype=torch.float32))
    labels = torch.tensor(y, dtype=torch.int64)
    net = import_factory(config.learner.model)(TaskInfo("classification", (x.shape[1],), 2))
    optimizer = torch.optim.Adam(net.parameters(), lr=1e-3, betas=(0.9, 0.98))
    weights = torch.tensor(config.task.class_weights or [1.0, 1.0], dtype=torch.float32)
    for _ in range(config.train.epochs):
        for batch in torch.randperm(len(labels)).split(config.train.batch_size):
            loss = torch.nn.functional.cross_entropy(net(inputs[batch]), labels[batch], weight=weights)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
    with torch.no_grad():
        test = normalize(torch.tensor(x_test, dtype=torch.float32))
        return np.asarray(net(test).softmax(1)[:, 1])


def prequential_figures(costs: list[float]) -> dict:
    from alma_daemon.observability.served_measure import judged_mean

    return {
        "cumulative_prequential_cost": sum(costs),
        "mean_prequential_cost": sum(costs) / len(costs),
        "served_cost": judged_mean(costs),
        "prequential_cost": [round(c, 4) for c in costs],
    }


#: Offline reference -> what it is.
REFERENCE_NAMES = {
    **{
        f"lr-weighted-{k}": f"LogisticRegression, class weights 1:50, threshold 0.5, last {k} chunk(s)" for k in WINDOWS
    },
    **{f"lr-plain-{k}": f"LogisticRegression, unweighted, threshold 1/51, last {k} chunk(s)" for k in WINDOWS},
    **{
        f"mlp-weighted-{k}": f"the team's network offline (from scratch, class weights 1:50, threshold 0.5), last {k} "
        "chunks"
        for k in NETWORK_WINDOWS
    },
    f"hgb-{BOOSTING_WINDOW}": f"HistGradientBoosting, unweighted, threshold 1/51, last {BOOSTING_WINDOW} chunks",
    "nothing": "flagging nothing",
    f"lr-prequential-{PREQUENTIAL_WINDOW}": f"LogisticRegression prequential (weighted, the {PREQUENTIAL_WINDOW} "
    "chunks before each chunk)",
}


# -- report ---------------------------------------------------------------------------------------------
FIELDS = [
    "test_pr_auc",
    "test_recall",
    "test_precision",
    "test_cost",
    "cumulative_prequential_cost",
    "cost_after_first_chunk",
    "mean_prequential_cost",
    "served_cost",
]
#: The row of the River linear reference that learned beside the example's runs.
REFERENCE_ROW = "River linear reference beside alma (LogisticRegression, chunk-prequential; the example's runs)"


def contenders(runs: dict[str, dict], configurations: list[str], seeds: list[int], keys: dict) -> dict[str, dict]:
    """Each contender's figures per seed (None where a run is missing): alma's configurations, then the
    offline references."""
    rows: dict[str, dict] = {}
    for name in configurations:
        records = [runs.get(keys[(name, seed)]) for seed in seeds]
        rows[CONFIGURATIONS[name][0]] = {"name": name, "records": records}
    if "example" in configurations:
        examples = [runs.get(keys[("example", seed)]) for seed in seeds]
        rows[REFERENCE_ROW] = {
            "name": "reference",
            "records": [None if r is None else r.get("reference") for r in examples],
        }
    offline = [runs.get(keys[("offline", seed)]) for seed in seeds]
    for name, label in REFERENCE_NAMES.items():
        records = [None if r is None else r["references"][name] for r in offline]
        rows[label] = {"name": name, "records": records}
    return rows


def field_value(record: dict, field: str) -> float | None:
    """A record's ``field``; ``cost_after_first_chunk`` is derived: the prequential cost summed over the
    chunks after the first. Before the first stage the daemon serves no version, while the simulated first
    chunk is measured on the untrained network (the paper's CER counts it): a network at random flags about
    half the transactions where River's untrained reference, its weights at zero, flags none."""
    if field == "cost_after_first_chunk":
        costs = record.get("prequential_cost")
        return None if not costs or any(c is None for c in costs) else sum(costs[1:])
    return record.get(field)


def summarized(records: list[dict | None]) -> dict | None:
    """Mean, standard deviation (over the seeds, n - 1) and per-seed values of each field."""
    if any(r is None for r in records):
        return None
    out: dict[str, Any] = {}
    for field in FIELDS:
        values = [field_value(r, field) for r in records if r is not None]
        if any(v is None for v in values):
            continue
        out[field] = {
            "mean": statistics.fmean(values),
            "sd": statistics.stdev(values) if len(values) > 1 else None,
            "per_seed": values,
        }
    for field in ("stages", "seconds"):
        values = [r[field] for r in records if r is not None and field in r]
        if values:
            out[field] = statistics.fmean(values)
    return out


def verdicts(summary: dict[str, dict | None], configurations: list[str]) -> dict | None:
    """Issue 50's target on the means over the seeds; None until the runs it reads are done."""
    example = summary.get(CONFIGURATIONS["example"][0])
    nothing = summary.get(REFERENCE_NAMES["nothing"])
    logistic = {
        label: row
        for name, label in REFERENCE_NAMES.items()
        if name.startswith(("lr-weighted", "lr-plain")) and (row := summary.get(label)) is not None
    }
    if example is None or nothing is None or not logistic or "test_pr_auc" not in example:
        return None
    best = max(logistic, key=lambda label: logistic[label]["test_pr_auc"]["mean"])
    best_pr_auc = logistic[best]["test_pr_auc"]["mean"]
    ours = example["test_pr_auc"]["mean"]
    cumulative = example["cumulative_prequential_cost"]["mean"]
    result: dict[str, Any] = {
        "best logistic regression": best,
        "its test PR-AUC": best_pr_auc,
        "the example's test PR-AUC": ours,
        "PR-AUC ratio": ours / best_pr_auc,
        "PR-AUC within 10 % of the best logistic regression's": ours >= 0.9 * best_pr_auc,
        "cumulative prequential cost below flagging nothing's": cumulative
        < nothing["cumulative_prequential_cost"]["mean"],
    }
    reference = summary.get(REFERENCE_ROW)
    if reference is not None:
        result["the River linear reference's cumulative prequential cost"] = reference["cumulative_prequential_cost"][
            "mean"
        ]
        result["cumulative prequential cost below the prequential River linear reference's"] = (
            cumulative < reference["cumulative_prequential_cost"]["mean"]
        )
    result["met"] = all(v for k, v in result.items() if isinstance(v, bool))
    # Beside the target: the nightly retrain, and the reference on the chunks a version was served on.
    nightly = summary.get(CONFIGURATIONS["nightly"][0]) if "nightly" in configurations else None
    if nightly is not None:
        result["cumulative prequential cost below the nightly retrain's (beside the target)"] = (
            cumulative < nightly["cumulative_prequential_cost"]["mean"]
        )
    after_first = example.get("cost_after_first_chunk")
    if reference is not None and after_first is not None and "cost_after_first_chunk" in reference:
        result["prequential cost after chunk 1 below the River linear reference's (beside the target)"] = (
            after_first["mean"] < reference["cost_after_first_chunk"]["mean"]
        )
    ours_served = example.get("served_cost")
    if reference is not None and ours_served is not None and "served_cost" in reference:
        result["served cost below the River linear reference's (beside the target)"] = (
            ours_served["mean"] < reference["served_cost"]["mean"]
        )
    return result


def cell(entry: dict | None, digits: int = 3) -> str:
    if entry is None:
        return "-"
    text = f"{entry['mean']:.{digits}f}"
    return text + (f" ± {entry['sd']:.{digits}f}" if entry["sd"] is not None else "")


def markdown(summary: dict[str, dict | None], judged: dict | None, meta: dict) -> str:
    lines = [
        "# Rare fraud with a changing rule (issue 50)",
        "",
        f"`{meta['command']}`  ",
        f"{meta['machine']}; history seeds {meta['seeds']} (none used to choose a constant); {meta['when']}; "
        f"{meta['run_seconds']:.0f} s of runs",
        "",
        "Per seed: 30,000 transactions over 60 days, 12 skewed features, about 0.7 % fraud, a new fraud rule "
        f"from day 30, rows shuffled (`make_transactions.py --rare --seed S`); 10 chunks of {meta['chunk_rows']} "
        f"rows ({meta['chunk_frauds']} frauds a chunk on average); the test set: the last {meta['test_rows']} rows "
        f"({meta['test_frauds']} frauds on average). Cost: 50 per fraud missed, 1 per false alarm, per transaction. "
        "Mean ± standard deviation over the seeds. Test figures: the final model on the test set; prequential: "
        "each chunk measured before the model trains on it (cumulative: the sum over the 10 chunks).",
        "",
        "Cost after chunk 1: the prequential cost summed over chunks 2-10, those a version was served on (the "
        "first is measured on the untrained network, as the paper's CER counts it; the daemon serves none then).",
        "",
        "| contender | test PR-AUC | test recall | test precision | test cost | cumulative prequential cost | "
        "cost after chunk 1 | mean prequential cost | served cost (chunks 6-10) | stages | s a run |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for label, row in summary.items():
        if row is None:
            lines.append(f"| {label} | not run (or not recorded) | | | | | | | | | |")
            continue
        cells = [cell(row.get(field)) for field in FIELDS]
        stages = f"{row['stages']:.1f}" if "stages" in row else ""
        seconds = f"{row['seconds']:.0f}" if "seconds" in row else ""
        lines.append(f"| {label} | {' | '.join(cells)} | {stages} | {seconds} |")
    lines.append("")
    if judged is None:
        lines += ["Target: not all runs it reads are done.", ""]
    else:
        ours, ratio = judged["the example's test PR-AUC"], judged["PR-AUC ratio"]
        best, best_pr_auc = judged["best logistic regression"], judged["its test PR-AUC"]
        lines += [
            f"Target (means over the seeds): the example's test PR-AUC {ours:.3f} is {ratio:.0%} of the best "
            f"logistic regression's ({best}: {best_pr_auc:.3f}).",
            "",
        ]
        for key, value in judged.items():
            if isinstance(value, bool) and key != "met":
                lines.append(f"- {key}: {'yes' if value else 'NO'}")
        lines += ["", f"Target {'met' if judged['met'] else 'MISSED'}.", ""]
    network = summary.get(REFERENCE_NAMES[f"mlp-weighted-{NETWORK_WINDOWS[-1]}"])
    if network is not None and judged is not None:
        ours = judged["the example's test PR-AUC"]
        # Splits the gap: what the network can do on these rows at all, and what the stream's recipe loses.
        lines += [
            f"The team's network itself, trained once offline from scratch on the last {NETWORK_WINDOWS[-1]} chunks, "
            f"reaches a test PR-AUC of {network['test_pr_auc']['mean']:.3f} "
            f"({network['test_pr_auc']['mean'] / judged['its test PR-AUC']:.0%} of the best logistic regression's): "
            "what lies between it and the logistic regression is the network's own on this few frauds, what lies "
            f"between it and the example's ({ours:.3f}) the stream's recipe's.",
            "",
        ]
    return "\n".join(lines)


def shown_path(path: Path) -> str:
    return str(path.resolve().relative_to(ROOT)) if path.resolve().is_relative_to(ROOT) else str(path)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seeds", nargs="+", type=int, help="history seeds (default 1-5; --quick: 1)")
    parser.add_argument("--configurations", nargs="+", choices=list(CONFIGURATIONS), help="alma's (default: all)")
    parser.add_argument("--quick", action="store_true", help=f"seed 1 and {', '.join(QUICK_CONFIGURATIONS)} only")
    parser.add_argument("--jobs", type=int, default=1, help="runs in parallel, one torch thread each")
    parser.add_argument("--runs", type=Path, default=RESULTS / "fraud_runs.json", help="cache of finished runs")
    parser.add_argument("--fresh", action="store_true", help="run again the runs the cache holds (alma's code changed)")
    parser.add_argument("--report-only", action="store_true", help="only rebuild the tables from --runs")
    parser.add_argument("--out", type=Path, default=RESULTS / "fraud.json")
    args = parser.parse_args()
    seeds = args.seeds or ([1] if args.quick else [1, 2, 3, 4, 5])
    configurations = args.configurations or (QUICK_CONFIGURATIONS if args.quick else list(CONFIGURATIONS))
    if not args.report_only:
        try:
            import sklearn  # noqa: F401
        except ImportError:
            sys.exit(MISSING_SKLEARN)
    args.out, args.runs = args.out.resolve(), args.runs.resolve()  # a relative path is the caller's
    os.chdir(ROOT)  # learner.model is imported from the working directory
    cache = RecordFile(args.runs)
    config_digest = hashlib.sha256(CONFIG.read_bytes()).hexdigest()[:16]
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="bench-fraud-") as folder:
        histories = {seed: write_history(Path(folder), seed) for seed in seeds}
        keys = {
            (name, seed): run_key(
                name if name != "offline" else f"offline-{OFFLINE_VERSION}",
                seed,
                {"history": histories[seed][1], "config": config_digest},
            )
            for seed in seeds
            for name in [*configurations, "offline"]
        }
        if not args.report_only:
            tasks = [
                PoolRun(keys[("offline", seed)], offline_references, (str(histories[seed][0]), seed)) for seed in seeds
            ]
            tasks += [
                PoolRun(keys[(name, seed)], run_alma, (name, str(histories[seed][0]), seed))
                for seed in seeds
                for name in configurations
            ]
            if args.fresh:
                todo = list({task.key: task for task in tasks}.values())
            else:
                _, todo = resume(tasks, cache)
            print(f"{len(todo)} run(s) to do, {args.jobs} at a time", flush=True)
            run_each(
                todo,
                cache,
                jobs=args.jobs,
                on_done=say_record,
                on_failed=lambda run, exc: print(f"FAILED {run.key}: {exc!r}", flush=True),
            )
    runs = cache.records
    rows = contenders(runs, configurations, seeds, keys)
    summary = {label: summarized(row["records"]) for label, row in rows.items()}
    judged = verdicts(summary, configurations)
    offline = [runs.get(keys[("offline", seed)]) for seed in seeds]
    done = [r for r in offline if r is not None]
    alma_records = [runs.get(keys[(name, seed)]) for seed in seeds for name in configurations]
    command = ["nice python benchmarks/bench_fraud.py", f"--seeds {' '.join(map(str, seeds))}"]
    command += [f"--configurations {' '.join(configurations)}", f"--out {shown_path(args.out)}"]
    meta = {
        "command": " ".join(command),
        "machine": f"{platform.machine()}, {os.cpu_count()} cores, torch "
        f"{', '.join(sorted({r['torch'] for r in runs.values() if 'torch' in r}))} (one thread a run)",
        "when": time.strftime("%Y-%m-%d"),
        "seeds": seeds,
        "configurations": {name: CONFIGURATIONS[name][1] for name in configurations},
        "chunk_rows": done[0]["chunk_rows"] if done else None,
        "chunk_frauds": round(statistics.fmean(f for r in done for f in r["chunk_frauds"]), 1) if done else None,
        "test_rows": done[0]["test_rows"] if done else None,
        "test_frauds": round(statistics.fmean(r["test_frauds"] for r in done), 1) if done else None,
        "run_seconds": round(sum(r["seconds"] for r in [*offline, *alma_records] if r is not None), 1),
    }
    if not args.report_only:
        meta["wall_seconds"] = round(time.perf_counter() - started, 1)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    per_seed = {label: row["records"] for label, row in rows.items()}
    args.out.write_text(
        json.dumps({"meta": meta, "summary": summary, "target": judged, "per_seed": per_seed}, indent=1) + "\n"
    )
    table = markdown(summary, judged, meta)
    args.out.with_suffix(".md").write_text(table + "\n")
    print(table)
    print(f"written: {args.out} and {args.out.with_suffix('.md')}")


def say_record(run: PoolRun, record: dict) -> None:
    if record["run"] == "offline":
        best = max(
            (name for name in record["references"] if name.startswith(("lr-weighted", "lr-plain"))),
            key=lambda n: record["references"][n].get("test_pr_auc") or 0.0,
        )
        figures = record["references"][best]
        print(
            f"offline  seed {record['seed']}: best LR {best} PR-AUC {figures['test_pr_auc']:.3f} cost "
            f"{figures['test_cost']:.3f}; test frauds {record['test_frauds']}  {record['seconds']} s",
            flush=True,
        )
        return
    pr_auc = record["test_pr_auc"]
    print(
        f"{record['run']:8} seed {record['seed']}: test PR-AUC {pr_auc if pr_auc is None else round(pr_auc, 3)}  "
        f"cost {record['test_cost']:.3f}  cumulative prequential cost {record['cumulative_prequential_cost']:.3f}  "
        f"stages {record['stages']}  {record['seconds']} s",
        flush=True,
    )


if __name__ == "__main__":
    main()
