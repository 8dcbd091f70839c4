"""The adaptive policy's drift detectors (policy.drift_detector) on seeded synthetic error series: a
rise of 1.5 points is seen within 10 chunks by the sequential tests, a stationary series of the same
noise raises no alarm, and the detector's state survives a restart."""

from __future__ import annotations

import json
import sys

import pytest
import torch

from alma_daemon.config import ConfigError, build_config
from policies.drift_detectors import DETECTORS, HISTORY, Rise, build_detector
from tests.helpers.policies import drive_adaptive

EXAMPLES = 1000  # per chunk
ERROR = 0.05
STEP = 0.015
DRIFT_AT = 150
SEQUENTIAL = ["page_hinkley", "adwin"]


def errors(chunks: int, seed: int, step_at: int | None = None) -> list[float]:
    """Each chunk's error: misclassified examples out of EXAMPLES, drawn at ERROR (+ STEP from ``step_at`` on)."""
    gen = torch.Generator().manual_seed(seed)
    rates = torch.full((chunks,), ERROR)
    if step_at is not None:
        rates[step_at - 1 :] += STEP
    return (torch.binomial(torch.full((chunks,), float(EXAMPLES)), rates, generator=gen) / EXAMPLES).tolist()


def alarms(detector: str, series: list[float], restart_every_chunk: bool = False) -> tuple[list[int], list[str]]:
    """The chunks at which the adaptive policy with ``detector`` trains for a drift, and every reason."""
    decisions = drive_adaptive(
        lambda chunk, stages, trained: series[chunk - 1],
        len(series),
        examples=EXAMPLES,
        policy_keys={"drift_detector": detector},
        restart_every_chunk=restart_every_chunk,
    )
    drifts = [chunk for chunk, d in enumerate(decisions, start=1) if d.trains and d.reason.startswith("drift")]
    return drifts, [d.reason for d in decisions]


@pytest.mark.parametrize("detector", SEQUENTIAL)
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_a_rise_of_one_and_a_half_points_is_seen_within_10_chunks(detector, seed):
    drifts, reasons = alarms(detector, errors(300, seed, step_at=DRIFT_AT))
    assert drifts, f"{detector} never fired"
    assert DRIFT_AT <= drifts[0] < DRIFT_AT + 10, drifts
    assert detector in reasons[drifts[0] - 1]


@pytest.mark.parametrize("detector", DETECTORS)
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_a_stationary_series_of_the_same_noise_raises_no_alarm(detector, seed):
    assert alarms(detector, errors(500, seed))[0] == []


def test_the_threshold_rule_is_blind_to_small_rises_and_sees_large_ones():
    assert alarms("threshold", errors(300, 0, step_at=DRIFT_AT))[0] == []
    big = [e + (0.15 - STEP if chunk >= DRIFT_AT else 0.0) for chunk, e in enumerate(errors(300, 0, DRIFT_AT), 1)]
    drifts, reasons = alarms("threshold", big)
    assert drifts[0] == DRIFT_AT
    assert "page_hinkley" not in reasons[DRIFT_AT - 1] and "adwin" not in reasons[DRIFT_AT - 1]


@pytest.mark.parametrize("detector", DETECTORS)
def test_decisions_survive_a_restart_after_every_chunk(detector):
    series = errors(300, 3, step_at=DRIFT_AT)
    assert alarms(detector, series, restart_every_chunk=True) == alarms(detector, series)


def fed(detector: str, scores: list[float]):
    built = build_detector(detector)
    for score in scores:
        built.update(Rise(jump=0.0, score=score))
    return built


@pytest.mark.parametrize("detector", SEQUENTIAL)
def test_the_saved_scores_rebuild_the_detector_and_are_bounded(detector):
    scores = torch.randn(200, generator=torch.Generator().manual_seed(0)).tolist()
    first = fed(detector, scores)
    second = build_detector(detector)
    second.load_state_dict(json.loads(json.dumps(first.state_dict())))
    assert second.state_dict() == first.state_dict()
    rise = [first.update(Rise(0.0, 2.0)) for _ in range(30)]
    assert rise == [second.update(Rise(0.0, 2.0)) for _ in range(30)] and any(rise)
    assert len(fed(detector, scores * 10).state_dict()["scores"]) == HISTORY


def test_an_unknown_detector_is_one_line_naming_the_key():
    with pytest.raises(ConfigError, match="policy.drift_detector") as error:
        build_config({"policy": {"name": "adaptive", "drift_detector": "cusum"}})
    assert "\n" not in str(error.value)


def test_a_detector_is_an_adaptive_key_only():
    with pytest.raises(ConfigError, match="drift_detector"):
        build_config({"policy": {"name": "geometric", "drift_detector": "adwin"}})


def test_without_river_the_refusal_names_the_extra(monkeypatch):
    # A None entry in sys.modules makes the import fail as if River were not installed.
    monkeypatch.setitem(sys.modules, "river.drift", None)
    with pytest.raises(
        ConfigError, match=r"policy.drift_detector: adwin needs River: pip install alma-daemon\[river\]"
    ):
        build_detector("adwin")
