"""The paper's findings F1-F8, and our F9, as rules written in code, judged on a study's results.

Each rule looks at the runs of one seed and answers yes or no, with the numbers it compared. A
finding *holds* when every seed says yes, *does not hold* when every seed says no, and is *mixed*
when the seeds disagree; the evidence keeps every seed's numbers and their mean, min and max. A rule
is written from the paper's sentence, not from our results: no threshold was chosen after looking.

The rules read only :class:`RunResult` fields (a summary and the test error after every chunk), so
a hand-made result set judges like a real one (tests/test_study.py).
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

HOLDS, DOES_NOT_HOLD, MIXED = "holds", "does not hold", "mixed"


@dataclass(frozen=True)
class RunResult:
    """One finished run: the study experiment it belongs to, the values its grid set, its seed."""

    experiment: str
    params: dict[str, Any]
    seed: int
    summary: dict[str, Any]
    test_error: list[float] = field(default_factory=list)

    @property
    def learner(self) -> str:
        return self.params.get("learner.name", "sm")

    @property
    def width(self) -> int:
        return self.params.get("learner.width", 0)

    @property
    def wait(self) -> int | None:
        return self.params.get("policy.wait") if self.params.get("policy.name", "fixed") == "fixed" else None

    @property
    def replay(self) -> bool:
        return bool(self.params.get("stream.replay", False))

    @property
    def cer(self) -> float:
        return self.summary["cer"]

    @property
    def final_error(self) -> float:
        return self.summary["final_test_error"]

    @property
    def flops(self) -> float:
        return self.summary["cumulative_train_flops"]

    @property
    def memory(self) -> float:
        return self.summary["cumulative_parameters"]

    @property
    def inference_flops(self) -> float:
        return self.summary["final_inference_flops_per_example"]


class MissingRuns(LookupError):
    """A rule needs runs the result set does not have (the study was cut short, or a run failed)."""


#: A rule: the runs of one seed -> (whether the finding holds, the evidence).
Judge = Callable[[list["RunResult"]], tuple[bool, dict[Any, Any]]]


@dataclass(frozen=True)
class Finding:
    """A claim of the paper and the rule that judges it on the runs of one seed."""

    id: str
    claim: str
    rule: str
    judge: Judge


def _select(runs: Iterable[RunResult], experiment: str | None = None, **params: Any) -> list[RunResult]:
    """Runs of ``experiment`` whose params match ``params`` (``learner`` for learner.name, etc.)."""
    keys = {"learner": "learner.name", "width": "learner.width", "wait": "policy.wait", "policy": "policy.name"}
    chosen = []
    for run in runs:
        if experiment is not None and run.experiment != experiment:
            continue
        if all(run.params.get(keys.get(k, k)) == v for k, v in params.items()):
            chosen.append(run)
    return chosen


def _one(runs: Iterable[RunResult], experiment: str, **params: Any) -> RunResult:
    found = _select(runs, experiment, **params)
    if len(found) != 1:
        raise MissingRuns(f"{experiment} {params}: {len(found)} run(s) for one seed")
    return found[0]


def _values(runs: Iterable[RunResult], experiment: str, key: str) -> list[Any]:
    values = {run.params.get(key) for run in runs if run.experiment == experiment}
    if not values:
        raise MissingRuns(f"no runs of {experiment}")
    return sorted(values)


def _error_at(run: RunResult, t: int) -> float:
    """Test error after chunk ``t`` (1-based)."""
    return run.test_error[t - 1]


def _chunks(run: RunResult) -> int:
    return len(run.test_error)


# -- the rules, one per finding ---------------------------------------------------------------------
#: Every finding, in the order reports show them; each is declared by :func:`finding` on its rule.
FINDINGS: list[Finding] = []


def finding(id: str, claim: str, rule: str) -> Callable[[Judge], Judge]:
    """Declare the finding ``id`` (the paper's ``claim``, judged by ``rule`` in words) on its judge."""

    def declare(judge: Judge) -> Judge:
        FINDINGS.append(Finding(id, claim, rule, judge))
        return judge

    return declare


@finding(
    "F1",
    "MNIST: an intermediate waiting time is best (lowest CER) only for small models; bigger ones prefer smaller w",
    "for SM on MNIST, the smallest width's lowest-CER wait lies strictly between the smallest and "
    "largest waits tried, and the largest width's lowest-CER wait is smaller than it",
)
def judge_intermediate_wait_best_for_small_models(runs: list[RunResult]) -> tuple[bool, dict[str, Any]]:
    waits, widths = _values(runs, "mnist-wait", "policy.wait"), _values(runs, "mnist-wait", "learner.width")
    best: dict[int, int] = {}
    cer: dict[int, dict[int, float]] = {}
    for width in (widths[0], widths[-1]):
        cer[width] = by_wait = {w: _one(runs, "mnist-wait", width=width, wait=w).cer for w in waits}
        best[width] = min(waits, key=lambda w: by_wait[w])
    small, large = widths[0], widths[-1]
    intermediate = waits[0] < best[small] < waits[-1]
    ok = intermediate and best[large] < best[small]
    return ok, {"best_wait": best, "cer_by_wait": cer, "small_best_is_intermediate": intermediate}


@finding(
    "F2",
    "CIFAR-10 without replay: an intermediate w gives the best CER for the compute; greedy leads "
    "only early; tardy has the best final error",
    "for SM on CIFAR-10 (smallest width): the lowest CER is at a wait strictly between greedy and "
    "tardy; greedy's mean test error over the first tenth of the stream is below the best "
    "intermediate wait's, and its final error above it; the tardy run's final error is the lowest",
)
def judge_intermediate_wait_best_on_cifar(runs: list[RunResult]) -> tuple[bool, dict[str, Any]]:
    waits, widths = _values(runs, "cifar-wait", "policy.wait"), _values(runs, "cifar-wait", "learner.width")
    by_wait = {w: _one(runs, "cifar-wait", width=widths[0], wait=w) for w in waits}
    greedy, tardy = by_wait[waits[0]], by_wait[waits[-1]]
    if tardy.wait != _chunks(tardy):
        raise MissingRuns(f"cifar-wait: no tardy run, w = B = {_chunks(tardy)} (largest wait {tardy.wait})")
    middle = {w: r for w, r in by_wait.items() if w not in (waits[0], waits[-1])}
    if not middle:
        raise MissingRuns("cifar-wait needs a wait between greedy and tardy")
    best_wait = min(by_wait, key=lambda w: by_wait[w].cer)
    best_middle = middle[min(middle, key=lambda w: middle[w].cer)]
    tenth = max(1, _chunks(greedy) // 10)
    early = statistics.fmean(greedy.test_error[:tenth]), statistics.fmean(best_middle.test_error[:tenth])
    greedy_leads_early = early[0] < early[1]
    greedy_behind_at_end = greedy.final_error > best_middle.final_error
    tardy_best_final = all(tardy.final_error <= r.final_error for r in by_wait.values())
    ok = best_wait in middle and greedy_leads_early and greedy_behind_at_end and tardy_best_final
    return ok, {
        "width": widths[0],
        "cer_by_wait": {w: r.cer for w, r in by_wait.items()},
        "final_error_by_wait": {w: r.final_error for w, r in by_wait.items()},
        "best_wait": best_wait,
        "mean_error_first_tenth": {"greedy": early[0], "best_intermediate": early[1]},
        "greedy_leads_early": greedy_leads_early,
        "greedy_behind_at_end": greedy_behind_at_end,
        "tardy_best_final_error": tardy_best_final,
    }


#: The intermediate waiting time at which F3 compares sizes (the paper's w = 10 on both datasets).
F3_WAIT = 10
#: Where F3 finds SM of several sizes at that wait, per dataset.
F3_EXPERIMENTS = {"mnist": ("mnist-wait",), "cifar": ("cifar-wait", "cifar-large")}


@finding(
    "F3",
    "larger models are statistically more efficient: the large model after a tenth of the stream "
    "beats the small one at its end",
    f"at w = {F3_WAIT}, the largest SM's test error after B/10 chunks is below the smallest SM's "
    "final test error, on every dataset of the study that has two widths",
)
def judge_large_models_learn_more_per_example(runs: list[RunResult]) -> tuple[bool, dict[str, Any]]:
    evidence, oks = {}, []
    for dataset in ("mnist", "cifar"):
        sizes = [
            r
            for r in runs
            if r.experiment in F3_EXPERIMENTS[dataset] and r.learner == "sm" and r.wait == F3_WAIT and not r.replay
        ]
        if len({r.width for r in sizes}) < 2:
            continue
        small, large = min(sizes, key=lambda r: r.width), max(sizes, key=lambda r: r.width)
        # At least one chunk: B // 10 = 0 would read test_error[-1], the large model's final error.
        tenth = max(1, _chunks(large) // 10)
        ok = _error_at(large, tenth) < small.final_error
        oks.append(ok)
        evidence[dataset] = {
            "small_width": small.width,
            "large_width": large.width,
            "large_error_after_a_tenth": _error_at(large, tenth),
            "small_final_error": small.final_error,
            "holds": ok,
        }
    if not oks:
        raise MissingRuns("no experiment with two widths at w = 10")
    return all(oks), evidence


def _mnist_pool(runs: list[RunResult]) -> list[RunResult]:
    """MNIST runs without replay at the methods' waiting time: the pool growing methods face."""
    return [r for r in runs if r.experiment in ("mnist-methods", "mnist-sm-sizes")]


def _best_within(candidates: list[RunResult], budget: Callable[[RunResult], float], limit: float) -> RunResult | None:
    within = [r for r in candidates if budget(r) <= limit]
    return min(within, key=lambda r: r.cer) if within else None


@finding(
    "F4",
    "growing does not pay: at equal compute or memory, SM of average size beats gMoE and FF; Ens "
    "beats gEns at equal inference cost",
    "on MNIST at the methods' wait: for every gMoE and Firefly run, the best SM with no more "
    "cumulative training FLOPs, and the best SM with no more cumulative parameters, each have a "
    "lower CER; for every gEns run, the best Ens with no higher final inference FLOPs per example "
    "has a lower CER",
)
def judge_growing_does_not_pay(runs: list[RunResult]) -> tuple[bool, dict[str, Any]]:
    pool = _mnist_pool(runs)
    sms = [r for r in pool if r.learner == "sm"]
    comparisons, oks = [], []
    for grower in (r for r in pool if r.learner in ("gmoe", "firefly")):
        for budget_name, budget in (("compute", _flops), ("memory", _memory)):
            best = _best_within(sms, budget, budget(grower))
            ok = best is not None and best.cer < grower.cer
            oks.append(ok)
            comparisons.append(_comparison(grower, best, budget_name, ok))
    ens = [r for r in pool if r.learner == "ens"]
    for gens in (r for r in pool if r.learner == "gens"):
        best = _best_within(ens, _inference, gens.inference_flops)
        ok = best is not None and best.cer < gens.cer
        oks.append(ok)
        comparisons.append(_comparison(gens, best, "inference cost", ok))
    if not oks:
        raise MissingRuns("mnist-methods has no growing learner")
    return all(oks), {"comparisons": comparisons, "won": sum(oks), "of": len(oks)}


def _flops(run: RunResult) -> float:
    return run.flops


def _memory(run: RunResult) -> float:
    return run.memory


def _inference(run: RunResult) -> float:
    return run.inference_flops


def _label(run: RunResult) -> str:
    return f"{run.learner}-{run.width}"


def _comparison(run: RunResult, best: RunResult | None, budget: str, ok: bool) -> dict[str, Any]:
    return {
        "run": _label(run),
        "budget": budget,
        "cer": run.cer,
        "best_fixed_within_budget": _label(best) if best else None,
        "its_cer": best.cer if best else None,
        "fixed_wins": ok,
    }


@finding(
    "F5",
    "the operating point matters: UMix edges Ens for small members, Ens wins for large ones",
    "on MNIST at the methods' wait: UMix's CER is below Ens's at the smallest member width, and "
    "Ens's below UMix's at the largest",
)
def judge_umix_edges_ens_only_for_small_members(runs: list[RunResult]) -> tuple[bool, dict[str, Any]]:
    widths = _values(runs, "mnist-methods", "learner.width")
    cer = {
        width: {m: _one(runs, "mnist-methods", learner=m, width=width).cer for m in ("umix", "ens")}
        for width in (widths[0], widths[-1])
    }
    small_umix = cer[widths[0]]["umix"] < cer[widths[0]]["ens"]
    large_ens = cer[widths[-1]]["ens"] < cer[widths[-1]]["umix"]
    return small_umix and large_ens, {
        "cer": cer,
        "umix_wins_small": small_umix,
        "ens_wins_large": large_ens,
    }


def _dominated(run: RunResult, others: Iterable[RunResult], budget: Callable[[RunResult], float]) -> RunResult | None:
    """A run at most as costly and with a lower CER, or at most as bad and strictly cheaper."""
    for other in others:
        if other is run:
            continue
        cheaper_or_equal, better_or_equal = budget(other) <= budget(run), other.cer <= run.cer
        if cheaper_or_equal and better_or_equal and (budget(other) < budget(run) or other.cer < run.cer):
            return other
    return None


@finding(
    "F6",
    "Ens strikes the best trade-off for larger models",
    "on MNIST at the methods' wait: at the largest member width Ens has the lowest CER of all "
    "methods, and no run of the pool (every method and SM size) is at least as good in CER at no "
    "more cumulative training FLOPs, nor at no more cumulative parameters",
)
def judge_ens_best_trade_off_for_large_models(runs: list[RunResult]) -> tuple[bool, dict[str, Any]]:
    pool = _mnist_pool(runs)
    widths = _values(runs, "mnist-methods", "learner.width")
    large = [r for r in pool if r.experiment == "mnist-methods" and r.width == widths[-1]]
    ens = _one(runs, "mnist-methods", learner="ens", width=widths[-1])
    lowest = min(large, key=lambda r: r.cer)
    by_flops, by_memory = _dominated(ens, pool, _flops), _dominated(ens, pool, _memory)
    ok = lowest is ens and by_flops is None and by_memory is None
    return ok, {
        "width": widths[-1],
        "cer_at_largest_width": {r.learner: r.cer for r in large},
        "ens_lowest_cer": lowest is ens,
        "ens_dominated_in_compute_by": _label(by_flops) if by_flops else None,
        "ens_dominated_in_memory_by": _label(by_memory) if by_memory else None,
    }


@finding(
    "F7",
    "replay lowers error but gives no better CER-for-compute trade-off",
    "on MNIST, for every (method, width) run with and without replay: replay lowers the CER, and "
    "every replay run is matched (at most its training FLOPs and at most its CER, one of them "
    "strictly) by some MNIST run without replay",
)
def judge_replay_lowers_error_not_the_trade_off(runs: list[RunResult]) -> tuple[bool, dict[str, Any]]:
    replayed = _select(runs, "mnist-replay", **{"stream.replay": True})
    if not replayed:
        raise MissingRuns("mnist-replay has no run with replay")
    without_replay = [r for r in runs if r.experiment.startswith("mnist") and not r.replay]
    pairs, lowers, dominated = [], [], []
    for run in replayed:
        plain = _one(runs, "mnist-replay", learner=run.learner, width=run.width, **{"stream.replay": False})
        by = _dominated(run, without_replay, _flops)
        lowers.append(run.cer < plain.cer)
        dominated.append(by is not None)
        pairs.append(
            {
                "run": _label(run),
                "cer": {"without": plain.cer, "with": run.cer},
                "final_error": {"without": plain.final_error, "with": run.final_error},
                "flops": {"without": plain.flops, "with": run.flops},
                "matched_without_replay_by": _label(by) + (f" w={by.wait}" if by and by.wait else "") if by else None,
            }
        )
    ok = all(lowers) and all(dominated)
    return ok, {"pairs": pairs, "replay_lowers_cer": all(lowers), "no_better_trade_off": all(dominated)}


@finding(
    "F8",
    "learning sequentially is harder than learning i.i.d. on the same data and compute",
    "for every SM width on MNIST, greedy training chunk by chunk (w = 1) ends with a higher test "
    "error than one stage on the whole stream (w = B), which sees the same examples for the same "
    "epochs (the same training FLOPs): `alma ablate-iid` with k = B",
)
def judge_sequential_is_harder_than_iid(runs: list[RunResult]) -> tuple[bool, dict[str, Any]]:
    waits, widths = _values(runs, "mnist-wait", "policy.wait"), _values(runs, "mnist-wait", "learner.width")
    evidence, oks = {}, []
    for width in widths:
        seq = _one(runs, "mnist-wait", width=width, wait=waits[0])
        iid = _one(runs, "mnist-wait", width=width, wait=waits[-1])
        if iid.wait != _chunks(iid):
            raise MissingRuns(f"mnist-wait width {width}: no run with w = B = {_chunks(iid)} (largest wait {iid.wait})")
        ok = seq.final_error > iid.final_error
        oks.append(ok)
        evidence[width] = {
            "sequential_final_error": seq.final_error,
            "iid_final_error": iid.final_error,
            "flops": {"sequential": seq.flops, "iid": iid.flops},
            "holds": ok,
        }
    return all(oks), evidence


@finding(
    "F9",
    "(ours) a waiting time that grows with the data trained on (geometric) beats every constant w in CER",
    "for every SM width on MNIST, the geometric policy's CER (ratio 0.5) is below the lowest CER "
    "of the constant waits tried",
)
def judge_geometric_beats_every_constant_wait(runs: list[RunResult]) -> tuple[bool, dict[int, dict[str, Any]]]:
    geometric = _select(runs, "mnist-geometric")
    if not geometric:
        raise MissingRuns("no runs of mnist-geometric")
    evidence, oks = {}, []
    for run in geometric:
        fixed = [r for r in _select(runs, "mnist-wait", width=run.width)]
        if not fixed:
            raise MissingRuns(f"mnist-wait has no width {run.width}")
        best = min(fixed, key=lambda r: r.cer)
        ok = run.cer < best.cer
        oks.append(ok)
        evidence[run.width] = {
            "geometric_cer": run.cer,
            "best_constant_wait": best.wait,
            "its_cer": best.cer,
            "relative_change": run.cer / best.cer - 1,
            "holds": ok,
        }
    return all(oks), evidence


def judge(finding: Finding, runs: list[RunResult]) -> dict[str, Any]:
    """The finding's verdict over the seeds present, with every seed's evidence."""
    seeds = sorted({run.seed for run in runs})
    per_seed, missing = {}, None
    for seed in seeds:
        try:
            ok, evidence = finding.judge([r for r in runs if r.seed == seed])
        except MissingRuns as exc:  # a rule's own KeyError or IndexError is a bug, and must show
            missing = f"{type(exc).__name__}: {exc}"
            continue
        per_seed[seed] = {"holds": ok, **evidence}
    entry: dict[str, Any] = {"id": finding.id, "claim": finding.claim, "rule": finding.rule}
    if not per_seed:
        entry.update(verdict="not judged", evidence={"missing": missing})
        return entry
    votes = [e["holds"] for e in per_seed.values()]
    verdict = HOLDS if all(votes) else DOES_NOT_HOLD if not any(votes) else MIXED
    evidence = {"seeds_holding": f"{sum(votes)} of {len(votes)}", "per_seed": per_seed, **spread(per_seed)}
    if missing:
        evidence["missing"] = missing
    entry.update(verdict=verdict, evidence=evidence)
    return entry


def spread(per_seed: dict[int, dict[Any, Any]]) -> dict[str, Any]:
    """Mean, min and max over the seeds of every number that each seed's evidence has at one path."""
    leaves: dict[str, list[float]] = {}

    def walk(value: Any, path: str) -> None:
        if isinstance(value, dict):
            for key, sub in value.items():
                walk(sub, f"{path}.{key}" if path else str(key))
        elif isinstance(value, int | float) and not isinstance(value, bool):
            leaves.setdefault(path, []).append(float(value))

    for evidence in per_seed.values():
        walk({k: v for k, v in evidence.items() if k != "holds"}, "")
    stats = {
        path: {"mean": statistics.fmean(v), "min": min(v), "max": max(v)}
        for path, v in leaves.items()
        if len(v) == len(per_seed)
    }
    return {"over_seeds": stats} if len(per_seed) > 1 else {}


def judge_all(runs: list[RunResult], ids: Iterable[str] | None = None) -> list[dict[str, Any]]:
    wanted = set(ids) if ids is not None else None
    return [judge(f, runs) for f in FINDINGS if wanted is None or f.id in wanted]
