"""The part of ``alma report`` that judges waiting-time policies against schedules chosen in hindsight.

Where a folder holds, for one configuration, runs of schedules (``fixed``, ``geometric``) and of
policies that decide from the stream (``adaptive``, ``forecast``) on the same seeds, the report adds
``policies.png`` (CER against training FLOPs: the schedules, their Pareto front, each policy) and
one line per policy with its regret against the best schedule (observability/policy_regret.py).
``alma grid`` with a list of ``policy`` values and of seeds makes such a folder.

Runs are compared on their cumulative measure on the lower-is-better scale (:func:`cumulative_loss`):
the CER of the error rate, a cumulative cost or MSE as it is, and for a measure where higher is better
(recall, precision, PR-AUC) the sum of ``1 - value`` over the chunks tested, so that a larger
cumulative recall is a smaller loss and the best schedule is the one with the most recall.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path

from alma_daemon.observability.figures import POLICY_PREFIX, SEED_KEYS, RunLike, configurations, describe, flat
from alma_daemon.observability.measure_words import cumulative_key, higher_is_better, loss_words
from alma_daemon.observability.policy_regret import SCHEDULES, Outcome, plot_policies, regrets
from alma_daemon.observability.report_measures import run_measure

#: The figure's file name; ``policies-2.png`` and on where a folder holds several configurations.
FIGURE = "policies.png"


def cumulative_loss(run: RunLike) -> float | None:
    """The run's cumulative measure on the lower-is-better scale (see the module's docstring); None
    without a test set."""
    measure = run_measure(run)
    cumulative = run.summary.get(cumulative_key(measure))
    if cumulative is None or not higher_is_better(measure):
        return cumulative
    tested = sum(1 for row in run.series if row.get(f"test_{measure}") is not None)
    return tested - float(cumulative)


def policy_outcomes(runs: Sequence[RunLike]) -> dict[str, list[Outcome]]:
    """Per configuration (its policy keys aside) with both schedules and policies: each policy's CER
    (:func:`cumulative_loss`) and FLOPs on the seeds that every policy of the configuration ran."""
    # line -> policy -> seeds -> (run, its cumulative loss)
    lines: dict[str, dict[str, dict[tuple, tuple[RunLike, float]]]] = defaultdict(dict)
    for config, group in configurations(runs).items():
        params = dict(config)
        line = describe({k: v for k, v in params.items() if not k.startswith(POLICY_PREFIX)})
        policy = {k: v for k, v in params.items() if k.startswith(POLICY_PREFIX)}
        by_seed = {
            tuple(flat(run.config).get(key) for key in sorted(SEED_KEYS)): (run, loss)
            for run, loss in ((run, cumulative_loss(run)) for run in group)
            if loss is not None and run.summary.get("cumulative_train_flops")
        }
        if by_seed:
            lines[line][describe(policy)] = by_seed
    found = {}
    for line, policies in lines.items():
        seeds = sorted(set.intersection(*(set(by_seed) for by_seed in policies.values())), key=str)
        if not seeds:
            continue
        outcomes = []
        for name, by_seed in policies.items():
            first, _ = by_seed[seeds[0]]
            section = first.config.get("policy", {})
            outcomes.append(
                Outcome(
                    name,
                    tuple(float(by_seed[s][1]) for s in seeds),
                    tuple(float(by_seed[s][0].summary["cumulative_train_flops"]) for s in seeds),
                    schedule=section.get("name") in SCHEDULES,
                    price=float(section.get("compute_price") or 0.0),
                    unit=loss_words(run_measure(first)),
                )
            )
        if any(o.schedule for o in outcomes) and any(not o.schedule for o in outcomes):
            found[line] = outcomes
    return found


def policy_section(runs: Sequence[RunLike], folder: Path) -> tuple[list[str], list[tuple[str, str]]]:
    """Draw each configuration's policy figure into ``folder``; return the report's lines about them
    and the (file name, caption) of each figure drawn."""
    lines: list[str] = []
    drawn: list[tuple[str, str]] = []
    for index, (line, outcomes) in enumerate(policy_outcomes(runs).items(), start=1):
        name = FIGURE if index == 1 else FIGURE.replace(".png", f"-{index}.png")
        seeds = len(outcomes[0].cer)
        plot_policies(outcomes, f"{line}: mean of {seeds} seed(s)", folder / name)
        drawn.append((name, f"policies against schedules: {line}"))
        lines += [f"## Policies against the best schedule in hindsight: {line} ({seeds} seed(s))", ""]
        lines += [f"- {regret.line()}" for regret in regrets(outcomes)]
        lines.append("")
    return lines, drawn


def stale_figures(folder: Path, drawn: list[tuple[str, str]]) -> list[Path]:
    """Policy figures an earlier report of this folder drew that this one did not."""
    names = {name for name, _ in drawn}
    return [path for path in folder.glob("policies*.png") if path.name not in names]
