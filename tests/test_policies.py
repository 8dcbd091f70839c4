"""What each waiting-time policy does; the checks every policy shares are in test_policy_contract.py."""

from __future__ import annotations

import json
from datetime import datetime, timezone

import pytest

from alma_daemon.config import ConfigError, build_config, policy_config
from policies import Decision, Policy, PolicyState, build_policy

T0 = 1_704_067_200.0  # 2024-01-01 00:00 UTC, a Monday
HOUR = 3600.0
DAY = 24 * HOUR


def policy(name: str, **kwargs) -> Policy:
    return build_policy(policy_config(name=name, **kwargs))


def state(now: float = T0, pending: int = 1, **fields) -> PolicyState:
    defaults = dict(
        chunks_seen=pending,
        chunks_pending=pending,
        examples_pending=100 * pending,
        stages_done=0,
        now=now,
        started_at=T0,
        train_flops_total=0.0,
        train_seconds_total=0.0,
    )
    return PolicyState(**{**defaults, **fields})


def next_fire(p: Policy) -> float:
    return p.state_dict()["next_fire"]


# -- fixed ------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "wait,stages", [(1, list(range(1, 11))), (3, [3, 6, 9]), (10, [10])], ids=["greedy", "w=3", "tardy"]
)
def test_fixed_trains_every_wait_chunks(wait, stages):
    p = policy("fixed", wait=wait)
    trained_at, pending = [], 0
    for chunk in range(1, 11):
        pending += 1
        if p.decide(state(pending=pending, chunks_seen=chunk, stages_done=len(trained_at))).trains:
            trained_at.append(chunk)
            pending = 0
    assert trained_at == stages


# -- geometric --------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "ratio,stages",
    [(None, [1, 2, 3, 5, 8, 12, 18]), (1.0, [1, 2, 4, 8, 16]), (2.0, [1, 3, 9])],
    ids=["default-0.5", "1", "2"],
)
def test_geometric_waits_ratio_times_the_chunks_trained_on(ratio, stages):
    p = policy("geometric", ratio=ratio)
    trained_at, pending = [], 0
    for chunk in range(1, 21):
        pending += 1
        decision = p.decide(state(pending=pending, chunks_seen=chunk, stages_done=len(trained_at)))
        if decision.trains:
            trained_at.append(chunk)
            pending = 0
    assert trained_at == stages


def test_geometric_reason_shows_the_threshold():
    decision = policy("geometric").decide(state(pending=2, chunks_seen=7))
    assert not decision.trains
    assert decision.reason == "2 chunk(s) pending < max(1, 0.5 x 5 chunk(s) trained on) = 3"


# -- schedule ---------------------------------------------------------------------------------------
def test_cron_fires_once_per_period_and_only_with_a_new_chunk():
    p = policy("schedule", cron="0 2 * * *")
    assert not p.decide(state(T0 + 0.5 * HOUR)).trains
    assert next_fire(p) == T0 + 2 * HOUR

    fired = p.decide(state(T0 + 2 * HOUR))
    assert fired.trains and "2024-01-01T02:00:00+00:00" in fired.reason and "2024-01-02T02:00:00+00:00" in fired.reason
    assert not p.decide(state(T0 + 2.2 * HOUR, stages_done=1)).trains, "fired twice in one night"

    skipped = p.decide(state(T0 + DAY + 2 * HOUR, pending=0, stages_done=1))
    assert not skipped.trains and "skipped" in skipped.reason
    assert not p.decide(state(T0 + DAY + 3 * HOUR, stages_done=1)).trains, "a late chunk waits for the next night"
    assert p.decide(state(T0 + 2 * DAY + 2 * HOUR + 5, stages_done=1)).trains


def test_interval_fires_on_its_grid_and_coalesces_missed_periods():
    p = policy("schedule", interval_seconds=HOUR)
    assert not p.decide(state(T0)).trains
    assert not p.decide(state(T0 + HOUR - 1)).trains
    assert p.decide(state(T0 + HOUR)).trains
    assert not p.decide(state(T0 + HOUR + 100, stages_done=1)).trains
    assert p.decide(state(T0 + 5.5 * HOUR, stages_done=1)).trains
    assert next_fire(p) == T0 + 6 * HOUR
    assert not p.decide(state(T0 + 5.6 * HOUR, stages_done=2)).trains


def test_schedule_survives_a_restart_without_skipping_or_firing_twice():
    before = policy("schedule", cron="0 2 * * *")
    before.decide(state(T0 + 0.5 * HOUR))
    saved = json.dumps(before.state_dict())

    # Down from 00:30 to 03:00: the 02:00 fire is taken at restart, once.
    after = policy("schedule", cron="0 2 * * *")
    after.load_state_dict(json.loads(saved))
    assert after.decide(state(T0 + 3 * HOUR)).trains
    again = policy("schedule", cron="0 2 * * *")
    again.load_state_dict(json.loads(json.dumps(after.state_dict())))
    assert not again.decide(state(T0 + 3 * HOUR + 60, stages_done=1)).trains

    # Without its state a restarted policy re-anchors and waits for the next night.
    forgetful = policy("schedule", cron="0 2 * * *")
    assert not forgetful.decide(state(T0 + 3 * HOUR)).trains


def test_a_changed_schedule_discards_the_saved_fire_time():
    hourly = policy("schedule", interval_seconds=HOUR)
    hourly.decide(state(T0))
    daily = policy("schedule", interval_seconds=DAY)
    daily.load_state_dict(hourly.state_dict())
    assert not daily.decide(state(T0 + 2 * HOUR)).trains
    assert next_fire(daily) == T0 + 2 * HOUR + DAY


@pytest.mark.parametrize(
    "weekday,fires_on",
    [("1-5", "Mon"), ("0", "Sun"), ("7", "Sun"), ("sat", "Sat"), ("*/2", "Sat"), ("6-7", "Sat"), ("0,3", "Sun")],
)
def test_cron_weekdays_use_crontab_numbering(weekday, fires_on):
    p = policy("schedule", cron=f"0 2 * * {weekday}")
    p.decide(state(T0 + 4 * DAY + 3 * HOUR))  # Friday 03:00
    assert datetime.fromtimestamp(next_fire(p), timezone.utc).strftime("%a %H:%M") == f"{fires_on} 02:00"


def test_cron_is_read_in_the_configured_time_zone():
    p = policy("schedule", cron="0 2 * * *", timezone="Europe/Paris")
    p.decide(state(T0))
    assert next_fire(p) == T0 + HOUR  # 02:00 in Paris is 01:00 UTC in January


def test_schedule_from_a_config_file():
    config = build_config({"policy": {"name": "schedule", "cron": "0 2 * * *", "grow_every": 2}})
    p = build_policy(config.policy)
    p.decide(state(T0))
    assert p.decide(state(T0 + 2 * HOUR, stages_done=1, learner_grows=True)) == Decision.grow(
        "fire time 2024-01-01T02:00:00+00:00 with 1 new chunk(s); next at 2024-01-02T02:00:00+00:00; "
        "grow at stage 2 (grow_every=2)",
    )


# -- budget -----------------------------------------------------------------------------------------
def measured(now: float, flops: float = 0.0, seconds: float = 0.0, **fields) -> PolicyState:
    """After one stage that cost 1e9 FLOPs and 1 s per example; 100 examples pending."""
    return state(
        now,
        stages_done=1,
        train_flops_total=flops,
        train_seconds_total=seconds,
        flops_per_example=1e9,
        train_seconds_per_example=1.0,
        **fields,
    )


def test_budget_trains_the_first_chunk_before_any_cost_is_known():
    decision = policy("budget", flops_per_hour=1e12).decide(state(T0 + 60))
    assert decision.trains and "no FLOPs per example measured after 0 stage(s)" in decision.reason
    assert not policy("budget", flops_per_hour=1e12).decide(state(T0 + 60, pending=0)).trains


def test_budget_trains_within_and_waits_over_budget():
    p = policy("budget", flops_per_hour=1e12)
    within = p.decide(measured(T0 + HOUR - 100, flops=8e11))
    assert within.trains
    assert "spent 8e+11 + next stage 1e+11 (1e+09/example x 100) <= 1e+12 allowed (1e+12/h x 1 h)" in within.reason
    over = p.decide(measured(T0 + HOUR - 100, flops=9.5e11))
    assert not over.trains and "over budget" in over.reason and "> 1e+12 allowed" in over.reason
    assert p.decide(measured(T0 + 1.1 * HOUR, flops=9.5e11)).trains, "the allowance grows with time"


def test_budget_needs_every_configured_budget_to_fit():
    p = policy("budget", flops_per_hour=1e12, gpu_seconds_per_hour=60.0)
    decision = p.decide(measured(T0 + HOUR - 100, flops=1e11, seconds=50.0))
    assert not decision.trains
    assert "FLOPs: spent 1e+11" in decision.reason and "GPU-s: spent 50 + next stage 100" in decision.reason


def test_budget_estimates_the_examples_the_next_stage_fits_on():
    p = policy("budget", flops_per_hour=1e12)
    assert p.decide(measured(T0 + HOUR)).trains
    replaying = p.decide(measured(T0 + HOUR, next_stage_examples=2000))
    assert not replaying.trains and "x 2000" in replaying.reason


def test_budget_counts_the_stage_duration_as_elapsed_time():
    # A whole GPU per hour: busy all the time so far, the next stage still fits because it takes as
    # long as it spends.
    p = policy("budget", gpu_seconds_per_hour=3600.0)
    assert p.decide(measured(T0 + HOUR, seconds=HOUR - 10, examples_pending=1000)).trains


# -- config errors ----------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "name,kwargs,key",
    [
        ("schedule", {}, "policy.cron / policy.interval_seconds"),
        ("schedule", {"cron": "0 2 * * *", "interval_seconds": 60.0}, "policy.cron / policy.interval_seconds"),
        ("schedule", {"cron": "61 * * * *"}, "policy.cron: invalid"),
        ("schedule", {"cron": "0 2 * *"}, "policy.cron: '0 2 \\* \\*' has 4 fields"),
        ("schedule", {"cron": "0 0 30 2 *"}, "policy.cron: '0 0 30 2 \\*' never fires"),
        ("schedule", {"cron": "0 2 * * 8"}, "policy.cron: invalid.*0-7"),
        ("schedule", {"cron": "0 2 * * 5-1"}, "policy.cron: invalid.*backwards"),
        ("schedule", {"cron": "0 2 * * */0"}, "policy.cron: invalid.*step"),
        ("schedule", {"interval_seconds": 0.0}, "policy.interval_seconds: must be > 0"),
        ("schedule", {"cron": "0 2 * * *", "timezone": "Mars/Olympus"}, "policy.timezone"),
        (
            "schedule",
            {"cron": "0 2 * * *", "flops_per_hour": 1e12},
            "policy.flops_per_hour: not read by the 'schedule'",
        ),
        ("budget", {}, "policy.flops_per_hour / policy.gpu_seconds_per_hour"),
        ("budget", {"gpu_seconds_per_hour": 0.0}, "policy.gpu_seconds_per_hour: must be > 0"),
        ("fixed", {"cron": "0 2 * * *"}, "policy.cron: not read by the 'fixed'"),
        ("geometric", {"ratio": 0.0}, "policy.ratio: must be > 0"),
        ("fixed", {"ratio": 0.5}, "policy.ratio: not read by the 'fixed'"),
    ],
)
def test_config_errors_name_the_key(name, kwargs, key):
    with pytest.raises(ConfigError, match=key):
        policy(name, **kwargs)


def _state(**fields):
    base = dict(
        chunks_seen=5,
        chunks_pending=5,
        examples_pending=500,
        stages_done=0,
        now=0.0,
        started_at=0.0,
        train_flops_total=0.0,
        train_seconds_total=0.0,
    )
    return PolicyState(**{**base, **fields})


def test_the_freshness_bound_forces_a_stage_and_says_why():
    policy = build_policy(policy_config(name="fixed", wait=100, max_model_age_chunks=5))
    assert not policy.decide_within_bounds(_state(model_age_chunks=4)).trains
    forced = policy.decide_within_bounds(_state(model_age_chunks=5))
    assert forced.trains
    assert forced.reason.startswith("freshness bound: 5 chunk(s) since the last stage >= policy.max_model_age_chunks=5")
    assert "the policy would have waited: 5 chunk(s) pending < wait 100" in forced.reason


def test_the_bound_in_seconds_forces_a_stage_only_with_a_chunk_pending():
    policy = build_policy(policy_config(name="fixed", wait=100, max_model_age_seconds=60.0))
    assert policy.decide_within_bounds(_state(model_age_seconds=61.0)).trains
    assert not policy.decide_within_bounds(_state(model_age_seconds=61.0, chunks_pending=0)).trains


def test_adaptive_counts_a_forced_stage_as_its_own():
    policy = build_policy(policy_config(name="adaptive", max_model_age_chunks=1))
    for chunk in range(1, 6):
        state = _state(
            chunks_seen=chunk,
            chunks_pending=1,
            model_age_chunks=1,
            prequential=0.2,
            prequential_examples=100,
            newest_chunk=chunk,
        )
        assert policy.decide_within_bounds(state).trains
    # Five stages of one chunk each: its growing wait counts every chunk trained on.
    assert policy.trained == 5
