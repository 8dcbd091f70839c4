"""The adaptive waiting-time policy: its rules on scripted streams, and its place in the engine
(prequential errors in, reasons and estimates out, state across a restart, metrics)."""

from __future__ import annotations

import copy
import dataclasses
import json
import math
import urllib.request

import pytest
import torch
from prometheus_client.parser import text_string_to_metric_families

from alma_daemon import metrics
from alma_daemon.config import build_config, policy_config
from alma_daemon.core.chunk_buffer import MemoryBuffer
from alma_daemon.core.engine import Engine, EngineState
from alma_daemon.data.datasets import MNIST_TASK
from alma_daemon.data.streams import Chunk, partition
from alma_daemon.learners import build_learner
from alma_daemon.observability.exporter import MetricsObserver, start_exporter
from policies import build_policy
from policies.base import PolicyState
from tests.helpers.data import separable_data
from tests.helpers.policies import drive_adaptive

EXAMPLES = 1000  # per chunk: a standard error of about 0.01 at an error of 0.1


def drive(
    error_of,
    chunks: int,
    *,
    grows: bool = False,
    keeps_function: bool = False,
    grow_every: int = 1,
    measure: str = "error",
    restart_every_chunk: bool = False,
    first_id: int = 1,
):
    """The chunks at which the policy trained, and its decisions (see :func:`drive_adaptive`)."""
    decisions = drive_adaptive(
        lambda chunk, stages, trained: error_of(chunk, stages),
        chunks,
        examples=EXAMPLES,
        policy_keys={"grow_every": grow_every},
        restart_every_chunk=restart_every_chunk,
        first_id=first_id,
        learner_grows=grows,
        growth_keeps_function=keeps_function,
        measure=measure,
    )
    return [chunk for chunk, decision in enumerate(decisions, start=1) if decision.trains], decisions


def learning(chunk: int, stages: int) -> float:
    """Every stage pays off: the error halves with each one."""
    return 0.8 * 0.5**stages


def test_while_stages_pay_off_the_wait_grows_like_the_geometric_policy():
    trained_at, decisions = drive(learning, 20)
    assert trained_at == [1, 2, 3, 5, 8, 12, 18]
    assert decisions[3].reason.startswith(
        "1 chunk(s) pending < max(1, 0.5 x 3 chunk(s) trained on since the stream's start) = 2"
    )
    assert decisions[3].estimates["wait_chunks"] == 2
    assert "the last stage gained 0.1 " in decisions[4].reason and "paid off" in decisions[4].reason


def test_a_training_decision_exports_the_state_it_leaves_not_the_one_it_found():
    """The gauges show a decision's estimates until the next chunk: after a stage, a live model with
    nothing measured yet, the replaced one as the previous, and the wait for the next stage."""
    _, decisions = drive(learning, 5)
    stage = decisions[4]  # chunk 5: 2 pending after 3 trained, so it trains; 5 trained, next wait 3
    assert stage.trains and math.isnan(stage.estimates["live_error"])
    assert stage.estimates["previous_error"] == pytest.approx(0.1)  # the error after 3 stages, now replaced
    assert stage.estimates["wait_chunks"] == 3 and "stage_gain_score" not in stage.estimates


def test_a_stage_with_no_measurable_effect_keeps_the_wait_on_schedule():
    # A late stage's gain can be below one chunk's noise and still pay over every chunk that follows.
    trained_at, decisions = drive(lambda chunk, stages: 0.5, 20)
    assert trained_at == [1, 2, 3, 5, 8, 12, 18]
    assert "(0.0 standard errors: no measurable effect)" in decisions[2].reason
    assert decisions[3].estimates["stage_gain_score"] == pytest.approx(0.0)


def test_a_stage_that_made_the_model_worse_is_followed_on_schedule():
    trained_at, decisions = drive(lambda chunk, stages: 0.01 * 2**stages, 8)
    assert trained_at == [1, 2, 3, 5, 8]
    assert "made it worse" in decisions[1].reason


def test_a_jump_in_the_prequential_error_trains_at_once_and_restarts_the_wait():
    def labels_permuted_at_30(chunk: int, stages: int) -> float:
        # Eight stages happen before chunk 30; from there the model starts over at a high error.
        return learning(chunk, stages) if chunk < 30 else 0.9 * 0.5 ** (stages - 8)

    trained_at, decisions = drive(labels_permuted_at_30, 40)
    before = [t for t in trained_at if t < 30]
    assert before == [1, 2, 3, 5, 8, 12, 18, 27]
    assert trained_at[len(before) :] == [30, 31, 32, 34, 37]
    drift = decisions[29]
    assert drift.trains and drift.reason.startswith("drift: the newest chunk's error 0.9")
    assert "waiting again from chunk 30" in drift.reason and drift.estimates["drift_score"] > 4
    assert "made the model worse" not in drift.reason  # measured against the live model, two chunks in
    assert "since chunk 30" in decisions[30].reason


def test_a_jump_right_after_a_stage_is_named_a_drift_or_a_stage_that_made_the_model_worse():
    # The fifth stage (at chunk 8) ruins the model: the live model alone cannot tell that from a drift.
    trained_at, decisions = drive(lambda chunk, stages: learning(chunk, stages) if stages < 5 else 0.9, 10)
    assert trained_at[:6] == [1, 2, 3, 5, 8, 9]
    assert decisions[8].reason.startswith("drift: the newest chunk's error 0.9")
    assert "or the last stage made the model worse" in decisions[8].reason


def test_reasons_name_chunks_by_their_ids_not_by_how_many_came():
    """A daemon fed from a later chunk on (a replay with --from-chunk, dead-lettered chunks) names the
    chunks it met."""

    def drifts_at_the_30th(chunk: int, stages: int) -> float:
        return learning(chunk, stages) if chunk < 30 else 0.9 * 0.5 ** (stages - 8)

    _, decisions = drive(drifts_at_the_30th, 31, first_id=101)
    assert "waiting again from chunk 130" in decisions[29].reason and "since chunk 130" in decisions[30].reason


def test_a_measure_that_is_not_finite_is_left_out_and_the_wait_goes_on():
    """A diverged language model measures NaN: that is no drift, and the schedule is kept."""
    for measure, bad in (("error", math.nan), ("perplexity", math.nan), ("perplexity", math.inf)):
        trained_at, decisions = drive(
            lambda chunk, stages, bad=bad: bad if chunk in (15, 16) else 200.0 * 0.5**stages + 0.1,
            20,
            measure=measure,
        )
        assert trained_at == [1, 2, 3, 5, 8, 12, 18], measure
        assert not any(d.reason.startswith("drift") for d in decisions), measure
        assert "is not finite and was left out" in decisions[14].reason


def test_noise_around_a_steady_error_is_no_drift():
    wobble = [0.10, 0.12, 0.09, 0.13, 0.11, 0.08, 0.12]
    _, decisions = drive(lambda chunk, stages: wobble[chunk % len(wobble)], 60)
    assert not any(d.reason.startswith("drift") for d in decisions)


def test_a_learner_that_grows_an_untrained_part_grows_each_time_the_data_trained_on_grows_four_fold():
    flat = lambda chunk, stages: 0.5  # noqa: E731 - no stage ever changes the error
    for error_of in (flat, learning):
        trained_at, decisions = drive(error_of, 250, grows=True)
        assert trained_at == [1, 2, 3, 5, 8, 12, 18, 27, 41, 62, 93, 140, 210]
        grew = [t for t, d in zip(range(1, 251), decisions) if d.grows]
        # Chunks trained on before the stage: 5 >= 4 x 1, then 27 >= 4 x 5, then 140 >= 4 x 27.
        assert grew == [8, 41, 210] and all(decisions[t - 1].action == "grow+train" for t in grew)
    assert "grow first: 27 chunk(s) trained on >= 4 x max(1, 5 chunk(s)" in decisions[40].reason
    assert not any(d.grows for d in drive(flat, 60, grows=True, grow_every=0)[1])
    assert not any(d.grows for d in drive(flat, 60, grows=False)[1])


def test_after_a_drift_the_growth_count_starts_again_with_the_wait():
    drifting = lambda chunk, stages: 0.1 if chunk < 50 else 0.9  # noqa: E731
    trained_at, decisions = drive(drifting, 70, grows=True)
    assert decisions[49].reason.startswith("drift") and not decisions[49].grows
    # Chunk 50 counts as the new regime's first chunk trained on; at chunk 57 its stages have trained
    # on 5 >= 4 x 1 chunks, so it grows there as the stream's start did at chunk 8.
    assert trained_at[trained_at.index(50) :] == [50, 51, 52, 54, 57, 61, 67]
    assert [t for t, d in zip(range(1, 71), decisions) if d.grows] == [8, 41, 57]


def test_the_growth_count_survives_a_restart_at_every_chunk():
    flat = lambda chunk, stages: 0.5  # noqa: E731 - no stage ever changes the error
    trained_at, decisions = drive(flat, 60, grows=True, restart_every_chunk=True)
    assert trained_at == [1, 2, 3, 5, 8, 12, 18, 27, 41]
    assert [t for t, d in zip(range(1, 61), decisions) if d.grows] == [8, 41]


def test_a_learner_whose_growth_keeps_its_function_grows_at_every_stage():
    trained_at, decisions = drive(learning, 20, grows=True, keeps_function=True)
    assert [t for t, d in zip(range(1, 21), decisions) if d.grows] == trained_at == [1, 2, 3, 5, 8, 12, 18]
    assert "grow first: the learner's growth keeps its function" in decisions[0].reason
    assert not any(d.grows for d in drive(learning, 20, grows=True, keeps_function=True, grow_every=0)[1])


def test_language_models_are_judged_on_log_perplexity():
    trained_at, decisions = drive(lambda chunk, stages: 200.0 if chunk < 10 else 260.0, 14, measure="perplexity")
    assert 10 in trained_at and decisions[9].reason.startswith(
        "drift: the newest chunk's perplexity 260.00 is 30.0 % above the live model's perplexity 200.00"
    )
    assert "gained 0.0 % of the perplexity" in decisions[1].reason  # a log-perplexity is never shown as one
    assert "live_error" not in decisions[9].estimates  # an error gauge never shows a perplexity


def test_a_check_between_chunks_counts_nothing():
    policy = build_policy(policy_config(name="adaptive"))
    before = policy.state_dict()
    tick = PolicyState(
        chunks_seen=3,
        chunks_pending=2,
        examples_pending=200,
        stages_done=1,
        now=0.0,
        started_at=0.0,
        train_flops_total=0.0,
        train_seconds_total=0.0,
    )
    decision = policy.decide(tick)
    assert not decision.trains and "no new chunk measured" in decision.reason
    assert policy.state_dict() == before


# -- in the engine ----------------------------------------------------------------------------------
def engine_run(chunks: range, *, engine: Engine | None = None, observers=()) -> Engine:
    config = build_config(
        {
            "train": {"epochs": 2, "patience": 1, "batch_size": 64},
            "learner": {"width": 8},
            "policy": {"name": "adaptive"},
        }
    )
    if engine is None:
        learner = build_learner("sm", MNIST_TASK, config.learner, config.seed)
        engine = Engine(
            learner,
            build_policy(config.policy),
            MemoryBuffer(),
            config,
            torch.device("cpu"),
            test_set=separable_data(MNIST_TASK, 100, seed=2),
            observers=list(observers),
        )
    parts = partition(separable_data(MNIST_TASK, 60 * 12, seed=1), 12, seed=0)
    for i in chunks:
        engine.on_chunk(Chunk(i, parts[i - 1]))
    return engine


@pytest.mark.slow
def test_the_engine_hands_the_prequential_error_over_and_records_reasons_and_estimates():
    engine = engine_run(range(1, 13))
    series = engine.state.series
    assert series[0]["trained"] and sum(r["trained"] for r in series) >= 3
    assert f"live model error {series[1]['prequential_error']:.3f} on 1 chunk(s)" in series[1]["reason"]
    last = engine.state.last_decision
    assert last["reason"] == series[-1]["reason"]
    assert set(last["estimates"]) >= {"live_error", "wait_chunks", "drift_score"}


@pytest.mark.slow
def test_a_restarted_engine_with_the_saved_policy_state_continues_the_same_series():
    whole = engine_run(range(1, 13)).state.series
    first = engine_run(range(1, 7))
    # What the daemon saves at a commit and loads after a restart: engine state and policy state as JSON,
    # the model as its checkpoint (here a copy), the buffer in Redis (here the same buffer).
    state = EngineState(**json.loads(json.dumps(dataclasses.asdict(first.state))))
    policy = build_policy(first.policy.config)
    policy.load_state_dict(json.loads(json.dumps(first.policy.state_dict())))
    resumed = Engine(
        copy.deepcopy(first.learner),
        policy,
        first.buffer,
        first.config,
        torch.device("cpu"),
        test_set=first.test_set,
        state=state,
    )
    engine_run(range(7, 13), engine=resumed)
    keys = ("trained", "reason", "test_error", "prequential_error", "train_flops")
    assert [[r[k] for k in keys] for r in resumed.state.series] == [[r[k] for k in keys] for r in whole]


def test_the_policy_estimates_are_exported_as_metrics():
    with start_exporter(0) as exporter:
        engine = engine_run(range(1, 7), observers=[MetricsObserver(in_process_source=True)])
        with urllib.request.urlopen(f"{exporter.url}/metrics", timeout=10) as response:
            text = response.read().decode()
    samples = {s.name: s.value for f in text_string_to_metric_families(text) for s in f.samples}
    estimates = engine.state.last_decision["estimates"]
    for name, gauge in metrics.POLICY_ESTIMATES.items():
        exported = samples[gauge._name]  # every gauge, NaN for an estimate the last decision lacks
        expected = estimates.get(name, math.nan)
        assert exported == expected or (math.isnan(exported) and math.isnan(expected)), name
    assert samples["alma_policy_wait_chunks"] == estimates["wait_chunks"]
    assert samples["alma_policy_drift_score"] == estimates["drift_score"]
    assert not math.isnan(samples["alma_policy_previous_error_ratio"])


# -- in the daemon ----------------------------------------------------------------------------------
@pytest.mark.integration
@pytest.mark.slow
@pytest.mark.parametrize(
    "policy", [{"name": "adaptive"}, {"name": "forecast", "compute_price": 1e-12}], ids=["adaptive", "forecast"]
)
def test_a_crashed_daemon_resumes_the_adaptive_policy_and_equals_the_simulator_on_a_drifting_stream(
    tmp_path, redis_db, policy
) -> None:
    """Also forecast, adaptive's extension: its learning curve is part of the state a restart loads."""
    from alma_daemon.research.simulate import run_simulation
    from alma_daemon.transports.redis_stream import RedisStreamPublisher
    from alma_daemon.transports.replay import dataset_chunks, replay
    from tests.helpers.daemon import Crash, CrashOnce, engine_state, exact, run_daemon, service_config

    # Chunks of 1,000 images: enough for the model to learn before the labels change at chunk 4.
    drifting = {"megabatches": 6, "train_examples": 6000, "drift": {"kind": "permute_labels", "at": 4}}
    config = build_config(
        service_config(
            tmp_path,
            None,
            "adaptive",
            stream=drifting,
            policy=policy,
            train={"epochs": 5, "patience": 5},
            learner={"width": 16},
        )
    )
    replay(dataset_chunks(config), RedisStreamPublisher(redis_db, config.kafka.topic), "adaptive", progress=False)
    with pytest.raises(Crash):  # after the drift's stage, before its step is committed
        run_daemon(config, redis_db, until=6, observers=[CrashOnce("step", 4)])
    run_daemon(config, redis_db, until=6)

    served = engine_state(redis_db, "adaptive")["series"]
    simulated = run_simulation(config, progress=False)["series"]
    assert served[3]["reason"].startswith("drift: ")
    assert [r["reason"] for r in served] == [r["reason"] for r in simulated]
    assert exact(served) == exact(simulated)


def test_a_recall_on_a_few_positives_must_fall_beyond_its_binomial_noise_to_be_a_drift():
    # Recall 0.7 on chunks with 10 positives: a chunk at 0.4 is 2 standard errors down, noise; at 0.0, a drift.
    def recall(dip: float):
        return lambda chunk, stages, trained: dip if chunk == 8 else 0.7

    noisy = drive_adaptive(recall(0.4), 8, examples=10, measure="recall")
    assert not noisy[-1].reason.startswith("drift"), noisy[-1].reason
    lost = drive_adaptive(recall(0.0), 8, examples=10, measure="recall")
    assert lost[-1].reason.startswith(
        "drift: the newest chunk's recall 0.000 is 0.7 below the live model's recall 0.700"
    )


def test_a_mean_costs_standard_error_is_its_measured_spread():
    # The same rise of the mean cost is noise where single mistakes cost a lot, a drift where costs vary little.
    def cost(chunk, stages, trained):
        return 2.0 if chunk == 8 else 1.0

    spread_out = drive_adaptive(cost, 8, examples=100, measure="cost", prequential_unit_variance=40.0)
    assert not spread_out[-1].reason.startswith("drift"), spread_out[-1].reason
    steady = drive_adaptive(cost, 8, examples=100, measure="cost", prequential_unit_variance=0.5)
    assert steady[-1].reason.startswith("drift: the newest chunk's cost 2 is 1 above"), steady[-1].reason


def test_a_policy_built_on_adaptives_rules_changes_them_through_the_public_methods_alone():
    from policies.adaptive import Adaptive, AdaptiveConfig
    from policies.base import PolicyState

    class HalfPrice(Adaptive):
        """Waits twice adaptive's ratio and records what its hooks were given."""

        closed: list = []

        def wait_ratio(self, scale):
            return 2 * super().wait_ratio(scale)

        def stage_closed(self, trained, live, scale):
            self.closed.append((trained, live.chunks, scale.name))

    policy = HalfPrice(AdaptiveConfig())
    pending, trained_at = 0, []
    for chunk in range(1, 30):
        pending += 1
        decision = policy.decide(
            PolicyState(
                chunks_seen=chunk, chunks_pending=pending, examples_pending=100 * pending, stages_done=len(trained_at),
                now=0.0, started_at=0.0, train_flops_total=0.0, train_seconds_total=0.0,
                prequential=0.2, prequential_examples=100, measure="recall",
            )
        )  # fmt: skip
        if decision.trains:
            trained_at.append(chunk)
            pending = 0
    assert trained_at[:4] == [1, 2, 4, 8], "the wait is twice adaptive's 0.5 x chunks trained on"
    assert [name for *_, name in HalfPrice.closed] == ["recall"] * len(trained_at)
