"""The forecast waiting-time policy: its learning-curve fit, its wait, its price test, its drifts and
its state across a restart, on scripted streams whose error follows a known power law."""

from __future__ import annotations

import math
import random

import pytest

from alma_daemon.config import ConfigError, policy_config
from policies.base import Decision
from policies.forecast import DEFAULT_STAGE_PENALTY, LearningCurve, Slope, best_ratio
from policies.geometric import geometric_threshold
from policies.measure_scale import ChunkMeasures, MeasureScale
from tests.helpers.policies import drive_adaptive

EXAMPLES = 1000
FLOPS_PER_EXAMPLE = 1e6


def power_law(trained: int, slope: float = 0.4) -> float:
    return 0.6 * max(1, trained) ** -slope


def run(
    chunks: int,
    *,
    error_of=power_law,
    restart_every_chunk: bool = False,
    noise_seed: int | None = None,
    **keys,
) -> list[tuple[int, Decision]]:
    """Each chunk's decision by a forecast policy with ``keys``, on a stream whose prequential error is
    ``error_of(chunks trained on)`` (sampled binomially with ``noise_seed``); stages cost FLOPS_PER_EXAMPLE."""
    rng = random.Random(noise_seed)

    def measured(chunk: int, stages: int, trained: int) -> float:
        error = error_of(trained)
        if noise_seed is None:
            return error
        return sum(rng.random() < error for _ in range(EXAMPLES)) / EXAMPLES

    decisions = drive_adaptive(
        measured,
        chunks,
        examples=EXAMPLES,
        policy_keys=keys,
        restart_every_chunk=restart_every_chunk,
        policy_name="forecast",
        flops_per_example=FLOPS_PER_EXAMPLE,
    )
    return list(enumerate(decisions, start=1))


def stages(decisions: list[tuple[int, Decision]]) -> list[int]:
    return [chunk for chunk, decision in decisions if decision.trains]


def curve_of(points: list[tuple[int, float]], examples: int = 100_000) -> LearningCurve:
    curve = LearningCurve()
    for trained, error in points:
        errors = ChunkMeasures()
        errors.add(error, examples)
        curve.add(trained, errors)
    return curve


def test_the_slope_of_a_power_law_is_recovered_and_grows_certain_with_the_stages():
    few = curve_of([(n, power_law(n, 0.45)) for n in (1, 2)]).slope(MeasureScale("error"))
    many = curve_of([(n, power_law(n, 0.45)) for n in (1, 2, 3, 5, 8, 12, 18)]).slope(MeasureScale("error"))
    assert many.mean == pytest.approx(0.45, abs=0.02)
    assert many.sd < few.sd < 0.3
    assert many.points == 6  # the stages trained on at least 18 / 16 chunks: the local slope


def test_without_points_the_slope_is_the_prior():
    slope = LearningCurve().slope(MeasureScale("error"))
    assert (slope.mean, slope.sd, slope.points) == (pytest.approx(0.3), pytest.approx(0.3), 0)


def test_the_wait_grows_with_the_stage_penalty_and_hardly_with_the_slope():
    ratios = [best_ratio(Slope(0.3, 0.1, 5), k) for k in (0.1, 0.5, 2.0)]
    assert ratios == sorted(ratios) and ratios[0] < 0.6 < 1.5 < ratios[-1]
    steep, flat = best_ratio(Slope(0.6, 0.05, 5), 0.5), best_ratio(Slope(0.1, 0.05, 5), 0.5)
    assert abs(steep - flat) < 0.1 * flat


def test_without_a_price_it_trains_at_its_ratio_like_a_geometric_schedule():
    decisions = run(200)
    ratio = best_ratio(Slope(0.3, 0.3, 0), DEFAULT_STAGE_PENALTY)
    trained_at = stages(decisions)
    assert trained_at[0] == 1 and len(trained_at) >= 5
    trained = 0
    for before, at in zip([0, *trained_at], trained_at):
        # the ratio is learned as the stages come; it stays near the prior's on a clean power law
        assert at - before >= geometric_threshold(0.8 * ratio, trained)
        trained = at
    reason = decisions[trained_at[-1] - 1][1].reason
    assert "learning curve N^-0.4" in reason and "lowest forecast anytime error" in reason


def test_a_price_stops_training_once_a_stage_no_longer_pays_and_training_resumes_as_the_stream_ages():
    free = stages(run(400))
    priced_decisions = run(400, compute_price=1e-10)
    priced = stages(priced_decisions)
    assert len(priced) < len(free)
    held = [d for _, d in priced_decisions if not d.trains and "waiting until the stage pays" in d.reason]
    assert held, "the price never held a stage"
    assert "forecast gain" in held[0].reason and held[0].estimates["forecast_gain"] > 0
    # The horizon (chunks seen) grows, so the stage held first runs later, on more chunks.
    first_held = next(c for c, d in priced_decisions if "waiting until the stage pays" in d.reason)
    assert any(c > first_held for c in priced)


def test_a_price_too_high_for_any_stage_trains_only_the_first_chunk():
    assert stages(run(100, compute_price=1.0)) == [1]


def test_a_drift_trains_at_once_whatever_the_price_and_starts_the_curve_again():
    def drifting(trained: int) -> float:
        return power_law(trained)

    chunk_of_drift = 120
    state = {"chunk": 0}

    def error_of(trained: int) -> float:
        state["chunk"] += 1
        return 0.9 if state["chunk"] >= chunk_of_drift else drifting(trained)

    decisions = run(160, error_of=error_of, compute_price=2e-9)
    assert chunk_of_drift in stages(decisions)
    reason = decisions[chunk_of_drift - 1][1].reason
    assert reason.startswith("drift:")


def test_the_policy_resumes_from_its_saved_state_with_the_same_decisions():
    straight = run(150, noise_seed=3, compute_price=1e-9)
    restarted = run(150, noise_seed=3, compute_price=1e-9, restart_every_chunk=True)
    assert [(c, d.action, d.reason) for c, d in straight] == [(c, d.action, d.reason) for c, d in restarted]


def test_a_noisy_stream_gives_a_finite_slope_and_ratio_in_every_estimate():
    for _, decision in run(300, noise_seed=1):
        for name in ("forecast_slope", "forecast_slope_sd", "wait_ratio"):
            if name in decision.estimates:
                assert math.isfinite(decision.estimates[name])


@pytest.mark.parametrize(("key", "value"), [("compute_price", -1.0), ("stage_penalty", 0.0)])
def test_bad_values_fail_naming_the_key(key, value):
    with pytest.raises(ConfigError, match=key):
        policy_config(name="forecast", **{key: value})


def test_adaptive_does_not_read_the_forecast_keys():
    with pytest.raises(ConfigError, match="compute_price"):
        policy_config(name="adaptive", compute_price=1e-9)


def test_the_live_model_is_the_newest_point_of_the_curve():
    """A stage that halved the error shows in the slope before the next stage closes it."""
    flat_start = curve_of([(1, 0.4), (2, 0.4), (4, 0.4)])
    without = flat_start.slope(MeasureScale("error"))
    with_live = flat_start.slope(MeasureScale("error"), (8, 0.1, 4000))
    assert without.mean < 0.1 < 0.4 < with_live.mean


def test_told_the_streams_length_the_price_stops_training_as_the_end_nears():
    unknown = stages(run(200, compute_price=3e-11))
    told_decisions = run(200, compute_price=3e-11, expected_chunks=200)
    told = stages(told_decisions)
    assert told[-1] < unknown[-1]
    last_reason = told_decisions[-1][1].reason
    assert "chunk(s) to come (of the 200 expected)" in last_reason and "waiting until the stage pays" in last_reason
