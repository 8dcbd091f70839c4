"""The Open Inference Protocol publisher (``serving.kind: kserve``) against a real MLServer 1.7.1 (no mocks).

The same publisher and client as against KServe's model server, pointed at MLServer through
``serving.inference_url``; the server side is serving/runtimes/mlserver.py. MLServer runs from a
virtualenv of its own (scripts/setup_mlserver.sh); without it these tests are skipped. Each test
starts its own MLServer.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from alma_daemon.cli import main
from alma_daemon.config import build_config
from alma_daemon.core.checkpoint_index import WEIGHTS
from alma_daemon.learners import Learner
from alma_daemon.local_servers.mlserver import MLServerServer
from serving.protocols.codecs import ClassificationCodec
from serving.publishing import make_publisher
from serving.publishing.oip import OipClient, OipError, OipPublisher
from tests.helpers.serving import clients_during, metric_value, new_learner, save_version

pytestmark = pytest.mark.integration

MODEL = "alma"


def config_args(server: MLServerServer, store_root: Path, **serving) -> dict:
    return {
        "daemon": {"checkpoint_dir": str(store_root)},
        "serving": {"kind": "kserve", "model_name": MODEL, "inference_url": server.inference_url, **serving},
    }


def publisher_for(server: MLServerServer, store_root: Path, **serving) -> OipPublisher:
    publisher = make_publisher(build_config(config_args(server, store_root, **serving)))
    assert isinstance(publisher, OipPublisher)
    return publisher


def served(client: OipClient, name: str, x: torch.Tensor, learner: Learner) -> tuple[torch.Tensor, str]:
    """The probabilities ``name`` answers for ``x``, and the version it says it is."""
    codec = ClassificationCodec(learner.task)
    answer = client.infer(name, codec.encode_oip(x))
    return codec.decode_oip(answer), answer["model_version"]


def test_published_version_answers_like_the_learner_in_process(mlserver_server, tmp_path, good_and_bad):
    good, _, sample = good_and_bad
    server = mlserver_server(tmp_path / "ms")
    publisher = publisher_for(server, tmp_path / "ms")
    save_version(publisher.store, 1, good, sample)
    assert publisher.publish(1).action == "promoted"

    for name in (MODEL, f"{MODEL}-v1"):
        probabilities, version = served(publisher.client, name, sample.x, good)
        torch.testing.assert_close(probabilities, good.predict_proba(sample.x), rtol=0, atol=1e-5)
        assert version == "1"
    codec = ClassificationCodec(good.task)
    float_request = codec.encode_oip(sample.x[:8].float())  # the same pixels as FP32
    torch.testing.assert_close(
        codec.decode_oip(publisher.client.infer(MODEL, float_request)),
        good.predict_proba(sample.x[:8]),
        rtol=0,
        atol=1e-5,
    )
    with pytest.raises(OipError, match="each example must have shape") as err:
        publisher.client.infer(
            MODEL, {"inputs": [{"name": "x", "shape": [1, 3], "datatype": "FP32", "data": [1, 2, 3]}]}
        )
    assert err.value.status == 400
    with pytest.raises(OipError, match="no model 'other' here") as err:
        publisher.client.load("other")
    assert err.value.status == 404


def test_guard_refuses_a_worse_version_which_is_never_served(mlserver_server, tmp_path, good_and_bad):
    good, bad, sample = good_and_bad
    server = mlserver_server(tmp_path / "ms")
    publisher = publisher_for(server, tmp_path / "ms", promotion_margin=0.05)
    save_version(publisher.store, 1, good, sample)
    save_version(publisher.store, 2, bad, sample)
    publisher.publish(1)
    refused_before = metric_value("alma_promotions_refused_total")
    assert publisher.publish(2).action == "refused"
    assert publisher.served_versions() == [1]
    assert not publisher.client.model_ready(f"{MODEL}-v2")
    assert served(publisher.client, MODEL, sample.x[:4], good)[1] == "1"
    assert metric_value("alma_promotions_refused_total") == refused_before + 1


def test_rollback_loads_an_unloaded_version_again_and_versions_lists_it_live(
    mlserver_server, tmp_path, good_and_bad, capsys
):
    good, bad, sample = good_and_bad
    server = mlserver_server(tmp_path / "ms")
    publisher = publisher_for(server, tmp_path / "ms", keep_versions=0, promotion_margin=1.0)
    save_version(publisher.store, 1, good, sample)
    save_version(publisher.store, 2, bad, sample)
    publisher.publish(1)
    publisher.publish(2)
    assert publisher.served_versions() == [2]
    config = [
        arg
        for key, value in [
            ("daemon.checkpoint_dir", tmp_path / "ms"),
            ("serving.kind", "kserve"),
            ("serving.inference_url", server.inference_url),
            ("serving.keep_versions", 0),
        ]
        for arg in ("--set", f"{key}={value}")
    ]

    assert main(["rollback", *config, "--to", "1"]) == 0
    assert "version 1 is live (was 2)" in capsys.readouterr().out
    assert publisher.served_versions() == [1]
    probabilities, version = served(publisher.client, MODEL, sample.x[:4], good)
    assert version == "1"
    torch.testing.assert_close(probabilities, good.predict_proba(sample.x[:4]), rtol=0, atol=1e-5)

    assert main(["versions", *config, "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert [(r["version"], r["live"], r["registered"]) for r in rows] == [(1, True, True), (2, False, False)]


def test_clients_see_no_failure_during_ten_swaps(mlserver_server, tmp_path, good_and_bad):
    _, _, sample = good_and_bad
    server = mlserver_server(tmp_path / "ms")
    # keep_versions=0: each demoted version is unloaded right away, the riskiest case.
    publisher = publisher_for(server, tmp_path / "ms", keep_versions=0, promotion_margin=1.0)
    learners = {version: new_learner(seed=version) for version in range(1, 12)}
    for version, learner in learners.items():
        save_version(publisher.store, version, learner, sample)
    publisher.publish(1)
    x = sample.x[:4]
    expected = {str(version): learner.predict_proba(x) for version, learner in learners.items()}
    clients = [OipClient(server.inference_url) for _ in range(4)]

    def ask(client: int) -> str:
        probabilities, version = served(clients[client], MODEL, x, learners[1])
        right = version in expected and torch.allclose(probabilities, expected[version], rtol=0, atol=1e-5)
        return "ok" if right else f"version {version} answered {probabilities.tolist()}"

    def swaps() -> None:
        for version in range(2, 12):
            assert publisher.publish(version).action == "promoted"

    answers = clients_during(ask, swaps)
    failures = [a for log in answers for a in log if a != "ok"]
    assert failures == []
    assert all(len(log) > 0 for log in answers)
    assert publisher.served_versions() == [11]
    assert served(publisher.client, MODEL, x, learners[11])[1] == "11"


def test_versions_beyond_keep_versions_are_unloaded(mlserver_server, tmp_path, good_and_bad):
    good, _, sample = good_and_bad
    server = mlserver_server(tmp_path / "ms")
    publisher = publisher_for(server, tmp_path / "ms", keep_versions=1, promotion_margin=0.0)
    swaps_before = metric_value("alma_swaps_total")
    seen = []
    for version in (1, 2, 3):
        save_version(publisher.store, version, good, sample)
        assert publisher.publish(version).action == "promoted"
        seen.append((publisher.served_versions(), served(publisher.client, MODEL, sample.x[:4], good)[1]))
    assert seen == [([1], "1"), ([1, 2], "2"), ([2, 3], "3")]
    assert sorted(publisher.client.models()) == [MODEL, f"{MODEL}-v2", f"{MODEL}-v3"]
    assert not publisher.client.model_ready(f"{MODEL}-v1")
    assert publisher.live_version() == 3
    assert metric_value("alma_swaps_total") == swaps_before + 3


def test_the_default_name_takes_the_loaded_version_without_reading_its_weights(mlserver_server, tmp_path, good_and_bad):
    """Making a loaded version the default again reads nothing from disk: its weights file may be gone."""
    good, bad, sample = good_and_bad
    server = mlserver_server(tmp_path / "ms")
    publisher = publisher_for(server, tmp_path / "ms", keep_versions=1, promotion_margin=1.0)
    save_version(publisher.store, 1, good, sample)
    save_version(publisher.store, 2, bad, sample)
    publisher.publish(1)
    publisher.publish(2)
    (publisher.store.path(1) / WEIGHTS).unlink()

    publisher.make_default(1)
    probabilities, version = served(publisher.client, MODEL, sample.x[:4], good)
    assert version == "1"
    torch.testing.assert_close(probabilities, good.predict_proba(sample.x[:4]), rtol=0, atol=1e-5)
    with pytest.raises(OipError, match="weights"):
        publisher.client.load(f"{MODEL}-v1")  # a versioned name is always read again


def test_a_restarted_mlserver_serves_the_recorded_default_before_anything_is_asked(
    mlserver_server, tmp_path, good_and_bad
):
    good, bad, sample = good_and_bad
    server = mlserver_server(tmp_path / "ms")
    publisher = publisher_for(server, tmp_path / "ms", keep_versions=1, promotion_margin=1.0)
    save_version(publisher.store, 1, bad, sample)
    save_version(publisher.store, 2, good, sample)
    publisher.publish(1)
    publisher.publish(2)
    server.stop()
    server.start()

    assert sorted(publisher.client.models()) == [MODEL, f"{MODEL}-v2"]
    probabilities, version = served(publisher.client, MODEL, sample.x[:4], good)
    assert version == "2"
    torch.testing.assert_close(probabilities, good.predict_proba(sample.x[:4]), rtol=0, atol=1e-5)
    publisher.resync()
    assert publisher.served_versions() == [2]
    assert publisher.live_version() == 2
