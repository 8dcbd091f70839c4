"""``policies.png`` and ``policies-served.png`` in ``alma report``: policies against schedules, as a reader
of the report sees them.

The schedules are grey dots joined along their Pareto front, each named beside its dot; each policy is
a marker of its own color in the legend (a policy at several prices, one line through its prices,
each labelled). The FLOPs axis is logarithmic and labelled with plain numbers (observability/ticks.py):
the runs of one stream often differ by a few percent, where matplotlib's own labels run together. The
verdicts (regret, front) are observability/policy_regret.py's.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from alma_daemon.observability.figures import _figure, _finish, plt
from alma_daemon.observability.policy_regret import Outcome, pareto_front
from alma_daemon.observability.ticks import log_axis

_MARKERS = ("o", "s", "^", "D", "v", "P", "X", "*")
#: The schedules' color; the policies take tab10's others.
_SCHEDULE_COLOR = "0.5"
_COLORS = [plt.get_cmap("tab10")(i) for i in range(10) if i != 7]


def policy_families(outcomes: Sequence[Outcome]) -> dict[str, list[Outcome]]:
    """The policies (not the schedules) by name without their price: a policy run at several prices is
    one family, by increasing price."""
    families: dict[str, list[Outcome]] = {}
    for o in outcomes:
        if not o.schedule:
            families.setdefault(re.sub(r" ?price=\S+", "", o.name) or o.name, []).append(o)
    return {name: sorted(members, key=lambda o: o.price) for name, members in families.items()}


def _draw_schedules(ax: Any, outcomes: Sequence[Outcome]) -> None:
    """The schedules as named grey dots, their Pareto front a dashed step line."""
    schedules = [o for o in outcomes if o.schedule]
    ax.scatter(
        [o.mean_flops for o in schedules], [o.mean_cer for o in schedules], color=_SCHEDULE_COLOR, s=18, zorder=2
    )
    middle = math.sqrt(min(o.mean_flops for o in outcomes) * max(o.mean_flops for o in outcomes))
    for o in schedules:
        # Named on the side of the dot nearer the middle, so that no name runs past the axes.
        right = o.mean_flops <= middle
        ax.annotate(
            o.name.removeprefix("policy="),
            (o.mean_flops, o.mean_cer),
            fontsize=7,
            color=_SCHEDULE_COLOR,
            xytext=(4 if right else -4, 4),
            textcoords="offset points",
            ha="left" if right else "right",
        )
    front = pareto_front(list(outcomes))
    ax.step(
        [o.mean_flops for o in front],
        [o.mean_cer for o in front],
        where="post",
        color=_SCHEDULE_COLOR,
        lw=1,
        ls="--",
        label="schedules' Pareto front",
    )


def _draw_policies(ax: Any, outcomes: Sequence[Outcome]) -> None:
    """Each policy family as a marker (a line through its prices, each labelled)."""
    for i, (family, members) in enumerate(policy_families(outcomes).items()):
        color = _COLORS[i % len(_COLORS)]
        label = f"{family} at {len(members)} prices" if len(members) > 1 else members[0].name
        ax.plot(
            [o.mean_flops for o in members],
            [o.mean_cer for o in members],
            marker=_MARKERS[i % len(_MARKERS)],
            color=color,
            markersize=7,
            lw=1,
            zorder=3,
            label=label,
        )
        if len(members) > 1:
            for o in members:
                ax.annotate(
                    f"{o.price:g}",
                    (o.mean_flops, o.mean_cer),
                    fontsize=7,
                    color=color,
                    xytext=(4, -9),
                    textcoords="offset points",
                )


def plot_policies(outcomes: Sequence[Outcome], title: str, path: Path) -> None:
    """The outcomes' CER (their :attr:`Outcome.unit`) against training FLOPs: the schedules and their
    Pareto front in grey, each policy in a color of its own, named in the legend."""
    fig, (ax,) = _figure()
    _draw_schedules(ax, outcomes)
    _draw_policies(ax, outcomes)
    log_axis(ax, "x", [o.mean_flops for o in outcomes])
    # Room above and below the points, so that no schedule's name runs off the axes.
    values = [o.mean_cer for o in outcomes]
    low, high = min(values), max(values)
    margin = 0.12 * (high - low or abs(high) or 1.0)
    ax.set_ylim(low - margin, high + margin)
    ax.set_xlabel("cumulative training FLOPs (log)")
    ax.set_ylabel(outcomes[0].unit if outcomes else "CER")
    ax.grid(alpha=0.3, which="major")
    note = "grey: the schedules (waits fixed in advance), named beside each dot; lower is better"
    path.parent.mkdir(parents=True, exist_ok=True)
    _finish(fig, title, note, "policy", path)
