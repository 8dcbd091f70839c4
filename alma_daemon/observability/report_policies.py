"""The part of ``alma report`` that judges waiting-time policies against schedules chosen in hindsight.

Where a folder holds, for one configuration, runs of schedules (``fixed``, ``geometric``) and of
policies that decide from the stream (``adaptive``, ``forecast``) on the same seeds, the report adds
a table of each (its CER, its served measure, its longest wait, its FLOPs), ``policies.png`` (CER
against training FLOPs: the schedules, their Pareto front, each policy), ``policies-served.png`` (the
same for the served measure) and one line per policy with its regret against the best schedule on
each (observability/policy_regret.py; the figures: observability/policy_figure.py). ``alma grid`` with
a list of ``policy`` values and of seeds makes such a folder.

Runs are compared on their cumulative measure on the lower-is-better scale (:func:`cumulative_loss`):
the CER of the error rate, a cumulative cost or MSE as it is, and for a measure where higher is better
(recall, precision, PR-AUC) the sum of ``1 - value`` over the chunks tested, so that a larger
cumulative recall is a smaller loss and the best schedule is the one with the most recall. The served
measure (observability/served_measure.py: the prequential measure over the stream's second half, what
users saw) is put on the same scale (:func:`served_loss`). On an endless stream it, not the CER, is the
one to pick by: the CER sums the test measure over a finite stream, whose test set is the stream's
end, so it rewards leaving the stream's tail untrained.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from alma_daemon.observability.figures import POLICY_PREFIX, SEED_KEYS, RunLike, configurations, describe, flat
from alma_daemon.observability.measure_words import (
    cumulative_key,
    higher_is_better,
    loss_words,
    served_loss_words,
)
from alma_daemon.observability.policy_figure import plot_policies
from alma_daemon.observability.policy_regret import SCHEDULES, Outcome, regrets
from alma_daemon.observability.report_measures import run_measure
from alma_daemon.observability.served_measure import longest_wait, served_measure

#: The figures' file names; ``policies-2.png`` (``policies-served-2.png``) and on where a folder holds
#: several configurations.
FIGURE = "policies.png"
SERVED_FIGURE = "policies-served.png"
#: What the policies section says before its table.
PICK_BY_SERVED = (
    "On an endless stream, pick by the served measure (what users saw: each chunk's prequential measure, "
    "taken before the model trained on it, over the stream's second half), not by the CER: the CER sums the "
    "test measure over a finite stream whose test set is its end, so it rewards leaving the stream's tail "
    "untrained. The longest wait is the most chunks that arrived in a row without a stage (the worst seed's)."
)


def cumulative_loss(run: RunLike) -> float | None:
    """The run's cumulative measure on the lower-is-better scale (see the module's docstring); None
    without a test set."""
    measure = run_measure(run)
    cumulative = run.summary.get(cumulative_key(measure))
    if cumulative is None or not higher_is_better(measure):
        return cumulative
    tested = sum(1 for row in run.series if row.get(f"test_{measure}") is not None)
    return tested - float(cumulative)


def served_loss(run: RunLike) -> float | None:
    """The run's served measure on the lower-is-better scale: ``1 - value`` where higher is better; None
    where no chunk's prequential measure is finite."""
    measure = run_measure(run)
    served = served_measure(run.series, measure)
    return 1.0 - served if served is not None and higher_is_better(measure) else served


@dataclass(frozen=True)
class PolicyLine:
    """One configuration's schedules and policies, each on the seeds that all of them ran: their CER
    (:func:`cumulative_loss`), their served measure (:func:`served_loss`; empty where a run has none)
    and each one's longest wait over its seeds."""

    seeds: int
    cer: list[Outcome]
    served: list[Outcome]
    longest_wait: dict[str, int]


def _outcomes(
    by_policy: dict[str, dict[tuple[Any, ...], RunLike]],
    seeds: list[tuple[Any, ...]],
    loss: Callable[[RunLike], float | None],
    unit: str,
    decimals: int,
) -> list[Outcome]:
    """Each policy's ``loss`` and FLOPs on ``seeds``; empty where some run has no ``loss``."""
    outcomes = []
    for name, by_seed in by_policy.items():
        runs = [by_seed[s] for s in seeds]
        losses = [loss(run) for run in runs]
        if any(value is None for value in losses):
            return []
        section = runs[0].config.get("policy", {})
        outcomes.append(
            Outcome(
                name,
                tuple(float(value) for value in losses if value is not None),
                tuple(float(run.summary["cumulative_train_flops"]) for run in runs),
                schedule=section.get("name") in SCHEDULES,
                price=float(section.get("compute_price") or 0.0),
                unit=unit,
                decimals=decimals,
            )
        )
    return outcomes


def policy_lines(runs: Sequence[RunLike]) -> dict[str, PolicyLine]:
    """Per configuration (its policy keys aside) with both schedules and policies: each policy's CER,
    served measure and longest wait on the seeds that every policy of the configuration ran."""
    # line -> policy -> seeds -> run
    lines: dict[str, dict[str, dict[tuple[Any, ...], RunLike]]] = defaultdict(dict)
    for config, group in configurations(runs).items():
        params = dict(config)
        line = describe({k: v for k, v in params.items() if not k.startswith(POLICY_PREFIX)})
        policy = {k: v for k, v in params.items() if k.startswith(POLICY_PREFIX)}
        by_seed = {
            tuple(flat(run.config).get(key) for key in sorted(SEED_KEYS)): run
            for run in group
            if cumulative_loss(run) is not None and run.summary.get("cumulative_train_flops")
        }
        if by_seed:
            lines[line][describe(policy)] = by_seed
    found = {}
    for line, policies in lines.items():
        seeds = sorted(set.intersection(*(set(by_seed) for by_seed in policies.values())), key=str)
        if not seeds:
            continue
        measure = run_measure(next(iter(policies.values()))[seeds[0]])
        cer = _outcomes(policies, seeds, cumulative_loss, loss_words(measure), decimals=2)
        if any(o.schedule for o in cer) and any(not o.schedule for o in cer):
            found[line] = PolicyLine(
                seeds=len(seeds),
                cer=cer,
                # A mean over chunks, not a sum: its differences need more decimals.
                served=_outcomes(policies, seeds, served_loss, served_loss_words(measure), decimals=4),
                longest_wait={
                    name: max(longest_wait(by_seed[s].series) for s in seeds) for name, by_seed in policies.items()
                },
            )
    return found


def policy_outcomes(runs: Sequence[RunLike]) -> dict[str, list[Outcome]]:
    """Per configuration with both schedules and policies: each policy's CER (:func:`cumulative_loss`)
    and FLOPs on the seeds that every policy of the configuration ran (:func:`policy_lines`' CER)."""
    return {line: judged.cer for line, judged in policy_lines(runs).items()}


@dataclass(frozen=True)
class PolicySection:
    """What the report says of one configuration's policies: a title, the advice, a table (one row per
    schedule and policy), the regret lines and the figures drawn (file name, caption)."""

    title: str
    header: list[str]
    rows: list[list[str]]
    verdicts: list[str]
    figures: list[tuple[str, str]]

    def markdown(self) -> list[str]:
        table = ["| " + " | ".join(self.header) + " |", "|" + "---|" * len(self.header)]
        table += ["| " + " | ".join(row) + " |" for row in self.rows]
        return [f"## {self.title}", "", PICK_BY_SERVED, "", *table, "", *(f"- {v}" for v in self.verdicts), ""]


def _table(judged: PolicyLine) -> tuple[list[str], list[list[str]]]:
    served = {o.name: o for o in judged.served}
    header = ["policy", "kind", judged.cer[0].unit]
    header += [judged.served[0].unit] if served else []
    header += ["longest wait (chunks)", "training FLOPs"]
    rows = []
    for o in judged.cer:
        row = [o.name, "schedule" if o.schedule else "policy", f"{o.mean_cer:.4g}"]
        row += [f"{served[o.name].mean_cer:.4g}"] if served else []
        rows.append([*row, str(judged.longest_wait[o.name]), f"{o.mean_flops:.3g}"])
    return header, rows


def _figure_name(base: str, index: int) -> str:
    return base if index == 1 else base.replace(".png", f"-{index}.png")


def policy_section(runs: Sequence[RunLike], folder: Path) -> list[PolicySection]:
    """Draw each configuration's policy figures into ``folder``; return what the report says of each."""
    sections = []
    for index, (line, judged) in enumerate(policy_lines(runs).items(), start=1):
        title = f"{line}: mean of {judged.seeds} seed(s)"
        figures = [(_figure_name(FIGURE, index), f"policies against schedules: {line}")]
        plot_policies(judged.cer, title, folder / figures[0][0])
        verdicts = [regret.line() for regret in regrets(judged.cer)]
        if judged.served:
            figures.append((_figure_name(SERVED_FIGURE, index), f"policies against schedules, what users saw: {line}"))
            plot_policies(judged.served, f"{title}, what users saw", folder / figures[1][0])
            verdicts += [regret.line() for regret in regrets(judged.served)]
        header, rows = _table(judged)
        sections.append(
            PolicySection(
                f"Policies against the best schedule in hindsight: {line} ({judged.seeds} seed(s))",
                header,
                rows,
                verdicts,
                figures,
            )
        )
    return sections


def stale_figures(folder: Path, drawn: list[tuple[str, str]]) -> list[Path]:
    """Policy figures (``policies*.png``) an earlier report of this folder drew that this one did not."""
    names = {name for name, _ in drawn}
    return [path for path in folder.glob("policies*.png") if path.name not in names]
