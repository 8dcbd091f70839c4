"""``train.scratch_candidate``: each fine-tuning stage also trains the network from fresh weights on the
same examples and keeps whichever validates better (alma_daemon/core/engine.py)."""

from __future__ import annotations

import pytest

from alma_daemon.research.simulate import run_simulation
from tests.helpers.configs import sea_stream_config

pytest.importorskip("river")


def stream_config(candidate: bool):
    return sea_stream_config({"scratch_candidate": candidate}, stream={"drift": {"kind": "permute_labels", "at": 3}})


@pytest.fixture(scope="module")
def runs() -> tuple[list[dict], list[dict]]:
    with_candidate = run_simulation(stream_config(True), progress=False)["series"]
    without = run_simulation(stream_config(False), progress=False)["series"]
    return with_candidate, without


def test_the_first_stage_has_no_candidate_and_later_ones_pay_for_both(runs) -> None:
    with_candidate, without = runs
    first, second = with_candidate[0], with_candidate[1]
    assert first["kind"] == "finetune" and first["train_flops"] == without[0]["train_flops"]
    # Stage 2 starts from the same model in both runs: with a candidate it trains twice.
    assert second["train_flops"] > without[1]["train_flops"]
    assert {row["kind"] for row in with_candidate if row["trained"]} <= {"finetune", "scratch"}


def test_after_the_labels_are_permuted_a_network_from_fresh_weights_is_kept(runs) -> None:
    with_candidate, without = runs
    assert [row["kind"] for row in with_candidate[:2]] == ["finetune"] * 2
    # The stage on the first permuted chunk (the stream changed: it trains on that chunk alone).
    assert with_candidate[2]["kind"] == "scratch" and with_candidate[2]["restarted"]
    assert with_candidate[2]["test_error"] < without[2]["test_error"]


def test_a_fine_tuned_model_kept_is_the_one_a_run_without_candidate_trains(runs) -> None:
    with_candidate, without = runs
    # Up to the first stage that kept a from-scratch network, the served model is bit for bit the
    # fine-tuned one: the candidate's training left no trace (weights, decision) on it.
    kept = next((i for i, row in enumerate(with_candidate) if row.get("kind") == "scratch"), len(with_candidate))
    assert kept >= 2, "the test needs a stage that kept its fine-tuned model"
    for row, plain in zip(with_candidate[:kept], without[:kept], strict=True):
        assert row["test_error"] == plain["test_error"]
        assert row["prequential_error"] == plain["prequential_error"]
