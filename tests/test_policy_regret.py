"""Policies against schedules chosen in hindsight: the regret, the Pareto front and the cost at a
price (observability/policy_regret.py), and the report's section on them from real simulated runs."""

from __future__ import annotations

from pathlib import Path

import pytest

from alma_daemon.config import Config, build_config
from alma_daemon.observability.policy_regret import Outcome, pareto_front, regrets
from alma_daemon.observability.report import find_runs, write_report
from alma_daemon.observability.report_policies import policy_outcomes
from alma_daemon.research.grid import load_grid
from alma_daemon.research.simulate import run_simulation
from tests.helpers.data import TINY_MNIST


def schedule(name: str, cer: tuple[float, ...], flops: float) -> Outcome:
    return Outcome(name, cer, (flops,) * len(cer), schedule=True)


SCHEDULES = [
    schedule("fixed w=1", (30.0, 32.0, 34.0), 100.0),
    schedule("geometric 0.5", (20.0, 22.0, 24.0), 90.0),  # the best in hindsight
    schedule("geometric 1", (21.0, 23.0, 25.0), 50.0),
    schedule("geometric 2", (26.0, 28.0, 30.0), 40.0),
]


def test_the_front_holds_the_schedules_no_other_beats_on_both_cer_and_flops():
    assert [o.name for o in pareto_front(SCHEDULES)] == ["geometric 2", "geometric 1", "geometric 0.5"]


def test_a_policy_regret_is_its_per_seed_difference_to_the_best_schedule():
    policy = Outcome("forecast", (21.0, 22.0, 26.0), (60.0, 60.0, 60.0), schedule=False)
    (regret,) = regrets([*SCHEDULES, policy])
    assert regret.best == "geometric 0.5"
    assert regret.difference == pytest.approx(1.0)
    assert regret.standard_error == pytest.approx(1.0 / 3**0.5)
    assert regret.cer_ratio == pytest.approx(23 / 22) and regret.flops_ratio == pytest.approx(60 / 90)
    assert regret.beaten_by == "geometric 1"  # 23 CER at 50 FLOPs beats 23 at 60
    assert regret.cost_regret is None and "beaten on CER and FLOPs by geometric 1" in regret.line()


def test_at_a_price_the_cost_regret_is_against_the_cheapest_schedule_at_that_price():
    policy = Outcome("forecast price=0.1", (22.0, 22.0, 22.0), (45.0, 45.0, 45.0), schedule=False, price=0.1)
    (regret,) = regrets([*SCHEDULES, policy])
    # geometric 1 costs 23 + 5 = 28, the cheapest schedule; the policy 22 + 4.5.
    assert regret.cost_regret == pytest.approx(26.5 - 28.0)
    assert regret.beaten_by is None and "on or below the schedules' front" in regret.line()


def test_without_schedules_there_is_no_regret():
    assert regrets([Outcome("adaptive", (1.0,), (1.0,), schedule=False)]) == []


POLICIES = {
    "fixed": {"name": "fixed", "wait": 1},
    "geometric": {"name": "geometric", "ratio": 1.0},
    "forecast": {"name": "forecast"},
}


def test_the_report_of_a_folder_of_schedules_and_policies_judges_each_policy(tmp_path):
    for name, policy in POLICIES.items():
        for seed in (0, 1):
            config = build_config({"policy": policy, "seed": seed}, TINY_MNIST)
            run_simulation(config, tmp_path / f"{name}-{seed}", progress=False)

    (outcomes,) = policy_outcomes(find_runs(tmp_path)).values()
    assert sorted(o.name for o in outcomes if o.schedule) == ["policy=fixed wait=1", "policy=geometric ratio=1.0"]
    (policy,) = (o for o in outcomes if not o.schedule)
    assert len(policy.cer) == 2

    report = write_report(tmp_path).read_text()
    assert "## Policies against the best schedule in hindsight: sm (2 seed(s))" in report
    assert "- policy=forecast: CER x" in report and "regret" in report
    assert (
        tmp_path / "policies.png"
    ).stat().st_size > 0 and "![policies against schedules: sm](policies.png)" in report


def test_a_folder_without_policies_has_no_policy_section_and_loses_an_earlier_figure(tmp_path):
    for seed in (0, 1):
        run_simulation(build_config({"seed": seed}, TINY_MNIST), tmp_path / f"fixed-{seed}", progress=False)
    (tmp_path / "policies.png").write_bytes(b"an earlier report's")
    report = write_report(tmp_path).read_text()
    assert "Policies against" not in report and not (tmp_path / "policies.png").exists()


def test_the_shipped_policy_grid_is_schedules_and_policies_on_three_streams():
    runs = load_grid(Path(__file__).resolve().parents[1] / "examples" / "grids" / "policies.yaml")
    assert all(isinstance(config, Config) for _, config in runs), [c for _, c in runs if not isinstance(c, Config)]
    names = {config.policy.name for _, config in runs}
    assert {"fixed", "geometric"} <= names and {"adaptive", "forecast"} <= names
    assert {config.stream.seed for _, config in runs} == {0, 1, 2}
    assert "policy=geometric_0.5,seed=1" in {run.name for run, _ in runs}
