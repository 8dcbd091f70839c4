"""Waiting-time policies against the schedules chosen in hindsight: regret, the Pareto front, a figure.

A *schedule* fixes its waits in advance (``fixed``, ``geometric``); a *policy* decides them from the
stream (``adaptive``, ``forecast``, ...). Over the same streams (seeds), the best schedule in hindsight
is the one with the lowest mean CER, and a policy's regret is its CER above that schedule's, seed by
seed. With a compute price p, a run's cost is CER + p x training FLOPs, and a policy is judged by
whether some schedule beats it on both CER and FLOPs (it lies above their Pareto front).
``alma report`` and ``benchmarks/bench_policy.py`` both read their verdicts from here.

"CER" stands for any cumulative loss, lower is better: a task judged by another measure is compared on
its cumulative measure on the lower-is-better scale (``unit``: a cumulative cost, or the summed
``1 - recall`` of a measure where higher is better; observability/report_policies.py).
"""

from __future__ import annotations

import math
import re
import statistics
from dataclasses import dataclass
from pathlib import Path

from alma_daemon.observability.figures import SCHEDULE_POLICIES

#: Policies whose waits are fixed before the stream starts.
SCHEDULES = SCHEDULE_POLICIES


@dataclass(frozen=True)
class Outcome:
    """One policy's CER and training FLOPs on each stream (seeds in the same order for every outcome)."""

    name: str
    cer: tuple[float, ...]
    flops: tuple[float, ...]
    schedule: bool
    price: float = 0.0
    #: What ``cer`` holds: the CER, or another loss (lower is better): a cumulative measure, a served one.
    unit: str = "CER"
    #: The decimals a regret in :attr:`unit` is shown to: a sum over chunks needs fewer than a mean.
    decimals: int = 2

    @property
    def mean_cer(self) -> float:
        return statistics.fmean(self.cer)

    @property
    def mean_flops(self) -> float:
        return statistics.fmean(self.flops)

    def beats(self, other: Outcome) -> bool:
        """At most ``other``'s CER and FLOPs, and below it on one of them."""
        le = self.mean_cer <= other.mean_cer and self.mean_flops <= other.mean_flops
        return le and (self.mean_cer < other.mean_cer or self.mean_flops < other.mean_flops)


@dataclass(frozen=True)
class Regret:
    """A policy against the best schedule in hindsight (and the schedules' Pareto front)."""

    policy: str
    best: str
    cer_ratio: float
    flops_ratio: float
    #: Mean per-seed CER difference to the best schedule, and its standard error (None with one seed).
    difference: float
    standard_error: float | None
    #: The schedule beating it on both CER and FLOPs, if one does.
    beaten_by: str | None
    #: With a compute price: its cost (CER + price x FLOPs) above the cheapest schedule's at that price.
    price: float
    cost_regret: float | None
    #: Whether it trained with fewer FLOPs than every schedule, where no schedule can beat it on both.
    cheaper_than_every_schedule: bool = False
    #: What the CER figures are, and their decimals (:attr:`Outcome.unit`, :attr:`Outcome.decimals`).
    unit: str = "CER"
    decimals: int = 2

    def line(self) -> str:
        d = self.decimals
        se = "" if self.standard_error is None else f" +- {self.standard_error:.{d}f}"
        text = (
            f"{self.policy}: {self.unit} x{self.cer_ratio:.3f} and FLOPs x{self.flops_ratio:.2f} of the best "
            f"schedule ({self.best}), regret {self.difference:+.{d}f}{se} {self.unit}"
        )
        if self.price:
            text += f"; at price {self.price:g}/FLOP, cost regret {self.cost_regret:+.2f}"
        if self.beaten_by:
            front = f"beaten on {self.unit} and FLOPs by {self.beaten_by}"
        elif self.cheaper_than_every_schedule:
            front = "fewer FLOPs than every schedule (left of their front: judge it by the cost regret)"
        else:
            front = "on or below the schedules' front"
        return f"{text}; {front}"


def paired_difference(ours: tuple[float, ...], theirs: tuple[float, ...]) -> tuple[float, float | None]:
    """Mean per-seed difference and its standard error (None with one seed)."""
    differences = [a - b for a, b in zip(ours, theirs, strict=True)]
    spread = statistics.stdev(differences) / math.sqrt(len(differences)) if len(differences) > 1 else None
    return statistics.fmean(differences), spread


def pareto_front(outcomes: list[Outcome]) -> list[Outcome]:
    """The schedules no other schedule beats on both CER and FLOPs, by increasing FLOPs."""
    schedules = [o for o in outcomes if o.schedule]
    front = [o for o in schedules if not any(other.beats(o) for other in schedules)]
    return sorted(front, key=lambda o: o.mean_flops)


def regrets(outcomes: list[Outcome]) -> list[Regret]:
    """Each policy's regret against the best schedule; empty without both schedules and policies."""
    schedules = [o for o in outcomes if o.schedule]
    if not schedules:
        return []
    best = min(schedules, key=lambda o: o.mean_cer)
    verdicts = []
    for policy in (o for o in outcomes if not o.schedule):
        difference, spread = paired_difference(policy.cer, best.cer)
        beaten_by = next((s.name for s in pareto_front(outcomes) if s.beats(policy)), None)
        cost_regret = None
        if policy.price:
            cheapest = min(s.mean_cer + policy.price * s.mean_flops for s in schedules)
            cost_regret = policy.mean_cer + policy.price * policy.mean_flops - cheapest
        verdicts.append(
            Regret(
                policy=policy.name,
                best=best.name,
                cer_ratio=_ratio(policy.mean_cer, best.mean_cer),
                flops_ratio=policy.mean_flops / best.mean_flops,
                difference=difference,
                standard_error=spread,
                beaten_by=beaten_by,
                price=policy.price,
                cost_regret=cost_regret,
                cheaper_than_every_schedule=policy.mean_flops < min(s.mean_flops for s in schedules),
                unit=policy.unit,
                decimals=policy.decimals,
            )
        )
    return verdicts


def _ratio(ours: float, best: float) -> float:
    """``ours / best``; a best of 0 (a served error of 0) is matched only by 0, else beaten infinitely."""
    if best:
        return ours / best
    return 1.0 if ours == best else math.inf


def plot_policies(outcomes: list[Outcome], title: str, path: Path) -> None:
    """CER (the outcomes' :attr:`Outcome.unit`) against training FLOPs: the schedules as grey dots joined
    along their Pareto front, each policy as a labelled marker."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    schedules = [o for o in outcomes if o.schedule]
    ax.scatter([o.mean_flops for o in schedules], [o.mean_cer for o in schedules], color="grey", s=18, zorder=2)
    for o in schedules:
        ax.annotate(
            o.name, (o.mean_flops, o.mean_cer), fontsize=7, color="grey", xytext=(3, 3), textcoords="offset points"
        )
    front = pareto_front(outcomes)
    ax.step(
        [o.mean_flops for o in front],
        [o.mean_cer for o in front],
        where="post",
        color="grey",
        lw=1,
        ls="--",
        label="schedules' Pareto front",
    )
    # A policy at several prices is one line through its points, each labelled with its price.
    families: dict[str, list[Outcome]] = {}
    for o in outcomes:
        if not o.schedule:
            families.setdefault(re.sub(r" ?price=\S+", "", o.name) or o.name, []).append(o)
    markers = ("o", "s", "^", "D", "v", "P", "X", "*")
    # tab10 without its grey, which marks the schedules
    colors = [plt.get_cmap("tab10")(i) for i in range(10) if i != 7]
    for i, (family, members) in enumerate(families.items()):
        members = sorted(members, key=lambda o: o.price)
        label = f"{family} at {len(members)} prices" if len(members) > 1 else members[0].name
        ax.plot(
            [o.mean_flops for o in members],
            [o.mean_cer for o in members],
            marker=markers[i % 8],
            color=colors[i % 9],
            markersize=7,
            lw=1,
            zorder=3,
            label=label,
        )
        if len(members) > 1:
            for o in members:
                text = f"{o.price:g}" if o.price else "0"
                ax.annotate(
                    text,
                    (o.mean_flops, o.mean_cer),
                    fontsize=7,
                    color=colors[i % 9],
                    xytext=(4, -9),
                    textcoords="offset points",
                )
    ax.set_xscale("log")
    ax.set_xlabel("cumulative training FLOPs (log)")
    ax.set_ylabel(outcomes[0].unit if outcomes else "CER")
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=8)
    ax.set_title(title, fontsize=10)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
