"""Publishing to a real TorchServe 0.12 (started by the ``torchserve_server`` fixture; no mocks).

Skipped only where Java is absent. Each test starts its own TorchServe, so a test that stops the
server cannot disturb another.
"""

from __future__ import annotations

import dataclasses
import json
import shutil
import time
from pathlib import Path

import pytest
import safetensors.torch
import torch

from alma_daemon.cli import main
from alma_daemon.config import Config, build_config
from alma_daemon.data.datasets import CIFAR10_TASK, MNIST_TASK, TaskInfo
from alma_daemon.data.tensors import LabeledData
from alma_daemon.data.text import WordVocabulary, sequences
from alma_daemon.learners import build_learner
from alma_daemon.service.bootstrap import drop_uncommitted_checkpoints
from serving.protocols.codecs import SAFETENSORS_CONTENT_TYPE, codec_for
from serving.publishing import make_publisher
from serving.publishing.background import BackgroundPublisher
from serving.publishing.publisher import PublishError
from serving.publishing.torchserve import TorchServePublisher
from tests.helpers.configs import learner_settings
from tests.helpers.data import separable_data
from tests.helpers.servers import TorchServeServer, free_ports, http_request, java_available
from tests.helpers.serving import clients_during, metric_value, new_learner, quick_trainer, save_version
from tests.helpers.user_models import FEATURES, feature_data

pytestmark = pytest.mark.integration

MODEL = "alma"

TEXT = "the cat sat on the mat\nthe dog sat on the log\na cat and a dog\n" * 8
WORDS = WordVocabulary.from_text(TEXT)
LM_TASK = TaskInfo(
    "language_model", (8,), WORDS.vocab_size, extra={"vocab_size": WORDS.vocab_size, "tokenizer": WORDS.to_dict()}
)
TINY_LM = {"layers": 1, "d_model": 16, "heads": 2, "d_ff": 32, "experts": 2}

#: A team's own network (bundled in the archive) on standardized features of any sign and scale, asked
#: by the names of its features and answering by the names of its classes.
USER_MLP = "tests.helpers.user_models:tabular_mlp"
FEATURE_NAMES = [f"f{i:02d}" for i in range(FEATURES.input_shape[0])]
FEATURE_TASK = dataclasses.replace(
    FEATURES.with_statistics(feature_data(200, seed=0).x),
    classes=("low", "mid", "high"),
    extra={"features": FEATURE_NAMES},
)

#: Learner families the handler must serve: (learner name, task, learner config, train then grow
#: before saving). A new family is one more line here.
ROUND_TRIP = [
    pytest.param("sm", MNIST_TASK, {}, False, id="sm-mnist"),
    pytest.param("ens", CIFAR10_TASK, {"width": 4}, False, id="ens-cifar"),
    pytest.param("gmoe", MNIST_TASK, {}, True, id="grown-gmoe-mnist"),
    pytest.param("switch-lm", LM_TASK, TINY_LM, False, id="switch-lm-text"),
    pytest.param("ens", FEATURE_TASK, {"model": USER_MLP}, False, id="ens-user-model-features"),
]


def http_request_fails(url: str) -> bool:
    try:
        http_request("GET", url, timeout=2)
    except OSError:
        return True
    return False


def sample_for(task: TaskInfo, n: int) -> LabeledData:
    if task.kind == "language_model":
        tokens = sequences(WORDS.encode(TEXT), task.input_shape[0])
        # x and y are views of one tensor; safetensors refuses to save tensors sharing memory.
        return LabeledData(tokens.x[:n].clone(), tokens.y[:n].clone())
    return separable_data(task, n, seed=3) if task.pixels else feature_data(n, seed=3)


def torchserve_config(server: TorchServeServer, store_root: Path, **serving) -> Config:
    return build_config(
        {
            "daemon": {"checkpoint_dir": str(store_root)},
            "serving": {
                "kind": "torchserve",
                "model_name": MODEL,
                "management_url": server.management_url,
                "inference_url": server.inference_url,
                **serving,
            },
        }
    )


def publisher_for(server: TorchServeServer, tmp_path: Path, **serving) -> TorchServePublisher:
    publisher = make_publisher(torchserve_config(server, tmp_path / "model_store", **serving))
    assert isinstance(publisher, TorchServePublisher)
    return publisher


def predict(server: TorchServeServer, body: bytes, content_type: str = "application/json") -> tuple[int, dict]:
    status, answer = http_request(
        "POST", f"{server.inference_url}/predictions/{MODEL}", body, {"Content-Type": content_type}
    )
    return status, json.loads(answer)


@pytest.mark.parametrize("name,task,overrides,grow", ROUND_TRIP)
def test_handler_answers_like_the_learner_in_process(torchserve_server, tmp_path, name, task, overrides, grow):
    server = torchserve_server()
    publisher = publisher_for(server, tmp_path)
    learner = build_learner(name, task, learner_settings(name, {"width": 8, "members": 2}, overrides), 0)
    sample = sample_for(task, 16)
    if grow:
        learner.fit(sample, sample, quick_trainer())
        before = learner.num_parameters()
        learner.grow(sample, quick_trainer())
        learner.architecture_changed()
        assert learner.num_parameters() > before, "the case must serve a grown architecture"
    save_version(publisher.store, 1, learner, sample)
    assert publisher.publish(1).action == "promoted"
    codec = codec_for(task)

    request = codec.encode_json(sample.x)
    status, answer = predict(server, json.dumps(request).encode())
    assert status == 200, answer
    expected = codec.answer_json(learner, request)
    torch.testing.assert_close(codec.decode_json(answer), codec.decode_json(expected), rtol=0, atol=1e-5)
    if task.kind == "classification":
        torch.testing.assert_close(codec.decode_json(answer), learner.predict_proba(sample.x), rtol=0, atol=1e-5)
        status, answer = predict(server, safetensors.torch.save({"x": sample.x.contiguous()}), SAFETENSORS_CONTENT_TYPE)
        assert status == 200, answer
        torch.testing.assert_close(codec.decode_json(answer), learner.predict_proba(sample.x), rtol=0, atol=1e-5)
        status, answer = predict(server, json.dumps({"instances": [[1, 2, 3]]}).encode())
        assert status == 400 and "each example must have shape" in answer["error"]
        if task.classes:  # a team's task: the JSON of its events in, its class names out
            events = [dict(zip(FEATURE_NAMES, row)) for row in sample.x.tolist()]
            status, answer = predict(server, json.dumps(events).encode())
            assert status == 200, answer
            torch.testing.assert_close(codec.decode_json(answer), learner.predict_proba(sample.x), rtol=0, atol=1e-5)
            best = learner.predict_proba(sample.x).argmax(1).tolist()
            assert [p["class"] for p in answer["predictions"]] == [task.classes[i] for i in best]
            status, answer = predict(server, json.dumps({**events[0], FEATURE_NAMES[1]: "7"}).encode())
            assert status == 400 and f"field '{FEATURE_NAMES[1]}'" in answer["error"]
        if task.pixels:
            status, answer = predict(server, json.dumps({"instances": (sample.x[:1] / 255 - 0.5).tolist()}).encode())
            assert status == 400 and "raw units" in answer["error"]
    else:
        status, answer = predict(server, b"the cat sat on", "text/plain")
        assert status == 200, answer
        (prediction,) = answer["predictions"]
        assert len(prediction["tokens"]) == 10 and prediction["probabilities"] == sorted(
            prediction["probabilities"], reverse=True
        )
        status, answer = predict(server, json.dumps({"instances": [3]}).encode())
        assert status == 400 and "string" in answer["error"]


def test_publish_registers_promotes_then_drains_and_unregisters_old_versions(torchserve_server, tmp_path, good_and_bad):
    good, _, sample = good_and_bad
    server = torchserve_server()
    publisher = publisher_for(server, tmp_path, keep_versions=1, promotion_margin=0.0)
    swaps_before = metric_value("alma_swaps_total")
    served = []
    for version in (1, 2, 3):
        save_version(publisher.store, version, good, sample)
        assert publisher.publish(version).action == "promoted"
        served.append((publisher.served_versions(), publisher.client.default_version(MODEL)))
    assert served == [([1], 1), ([1, 2], 2), ([2, 3], 3)]
    assert publisher.live_version() == 3
    assert metric_value("alma_swaps_total") == swaps_before + 3
    assert metric_value("alma_live_model_version") == 3


def test_guard_refuses_a_worse_version_which_is_never_served(torchserve_server, tmp_path, good_and_bad):
    good, bad, sample = good_and_bad
    server = torchserve_server()
    publisher = publisher_for(server, tmp_path, promotion_margin=0.05)
    save_version(publisher.store, 1, good, sample)
    save_version(publisher.store, 2, bad, sample)
    publisher.publish(1)
    refused_before = metric_value("alma_promotions_refused_total")
    assert publisher.publish(2).action == "refused"
    assert publisher.served_versions() == [1]
    assert publisher.client.default_version(MODEL) == 1
    assert metric_value("alma_promotions_refused_total") == refused_before + 1


def test_rollback_re_registers_an_unloaded_version_and_versions_lists_it_live(
    torchserve_server, tmp_path, good_and_bad, capsys
):
    good, bad, sample = good_and_bad
    server = torchserve_server()
    publisher = publisher_for(server, tmp_path, keep_versions=0, promotion_margin=1.0)
    save_version(publisher.store, 1, good, sample)
    save_version(publisher.store, 2, bad, sample)
    publisher.publish(1)
    publisher.publish(2)
    assert publisher.served_versions() == [2]
    config = [
        "--set",
        f"daemon.checkpoint_dir={publisher.store.root}",
        "--set",
        "serving.kind=torchserve",
        "--set",
        f"serving.management_url={server.management_url}",
        "--set",
        f"serving.inference_url={server.inference_url}",
        "--set",
        "serving.keep_versions=0",
    ]

    assert main(["rollback", *config, "--to", "1"]) == 0
    assert "version 1 is live (was 2)" in capsys.readouterr().out
    assert publisher.client.default_version(MODEL) == 1
    assert publisher.served_versions() == [1]
    status, answer = predict(server, json.dumps({"instances": sample.x[:4].tolist()}).encode())
    assert status == 200
    torch.testing.assert_close(torch.tensor(answer["predictions"]), good.predict_proba(sample.x[:4]), rtol=0, atol=1e-5)

    assert main(["versions", *config, "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert [(r["version"], r["live"], r["registered"]) for r in rows] == [(1, True, True), (2, False, False)]


def test_clients_see_no_failure_during_ten_swaps(torchserve_server, tmp_path, good_and_bad):
    _, _, sample = good_and_bad
    server = torchserve_server()
    # keep_versions=0: each demoted version is drained and unregistered right away, the riskiest case.
    publisher = publisher_for(server, tmp_path, keep_versions=0, promotion_margin=1.0)
    for version in range(1, 12):
        save_version(publisher.store, version, new_learner(seed=version), sample)
    publisher.publish(1)
    body = json.dumps({"instances": sample.x[:4].tolist()}).encode()

    def ask(client: int) -> str:
        status, answer = predict(server, body)
        return "ok" if status == 200 and len(answer["predictions"]) == 4 else f"{status}: {answer}"

    def swaps() -> None:
        for version in range(2, 12):
            assert publisher.publish(version).action == "promoted"

    answers = clients_during(ask, swaps)
    failures = [a for log in answers for a in log if a != "ok"]
    assert failures == []
    assert all(len(log) > 0 for log in answers)
    assert publisher.served_versions() == [11]


def test_publishing_is_retried_while_torchserve_is_down_and_resumes_when_it_is_back(
    torchserve_server, tmp_path, good_and_bad
):
    good, _, sample = good_and_bad
    server = torchserve_server()
    publisher = publisher_for(server, tmp_path, promotion_margin=1.0)
    worker = BackgroundPublisher(publisher, retry_initial_seconds=0.2, retry_max_seconds=1.0).start()
    try:
        save_version(publisher.store, 1, good, sample)
        worker.submit(1)
        assert worker.wait_idle(timeout=120)
        assert publisher.client.default_version(MODEL) == 1

        server.stop()
        failures_before = metric_value("alma_swap_failures_total", stage="register")
        save_version(publisher.store, 2, good, sample)
        worker.submit(2)
        deadline = time.monotonic() + 60
        while metric_value("alma_swap_failures_total", stage="register") < failures_before + 2:
            assert time.monotonic() < deadline, "no failed attempt was counted while TorchServe was down"
            time.sleep(0.1)
        assert publisher.live_version() == 1

        # A restarted TorchServe has forgotten its models: the live one is registered again first.
        server.start()
        assert worker.wait_idle(timeout=180)
    finally:
        worker.close()
    assert publisher.live_version() == 2
    assert publisher.client.default_version(MODEL) == 2
    assert publisher.served_versions() == [1, 2]


def test_a_published_version_deleted_and_redone_serves_its_new_weights_also_after_a_torchserve_restart(
    torchserve_server, tmp_path, good_and_bad
):
    """Redis lost the commit of version 2's step after version 2 was published: the restarted daemon
    deletes version 2 and redoes the step, whose weights may differ (a GPU is not bit for bit
    repeatable). The redone version must replace the deleted one on TorchServe, and stay after a
    TorchServe restart (which keeps the copies of the archives it was given)."""
    good, bad, sample = good_and_bad
    server = torchserve_server()
    publisher = publisher_for(server, tmp_path, promotion_margin=1.0)
    first, redone = new_learner(seed=5), bad
    x = sample.x[:4]
    assert (first.predict_proba(x) - redone.predict_proba(x)).abs().max() > 1e-2
    save_version(publisher.store, 1, good, sample)
    save_version(publisher.store, 2, first, sample)
    publisher.publish(1)
    publisher.publish(2)

    drop_uncommitted_checkpoints(publisher.store, 1)  # the restart: Redis holds version 1's commit
    # TorchServe still answers with the withdrawn version 2 by default. A starting publisher resyncs
    # at once (not after resync_seconds), and handing over the committed version, which a reload does
    # and which is skipped as decided, sets it right too.
    background = BackgroundPublisher(publisher, resync_seconds=3600).start()
    try:
        deadline = time.monotonic() + 60  # a safety limit, not a timing check
        while publisher.client.default_version(MODEL) != 1:
            assert time.monotonic() < deadline, "the withdrawn version 2 still serves by default"
            time.sleep(0.2)
    finally:
        background.close()
    publisher.client.set_default(MODEL, 2)
    assert publisher.publish(1).action == "skipped" and publisher.client.default_version(MODEL) == 1
    save_version(publisher.store, 2, redone, sample)
    assert publisher.publish(2).action == "promoted"

    def served() -> torch.Tensor:
        status, answer = predict(server, json.dumps({"instances": x.tolist()}).encode())
        assert status == 200, answer
        return torch.tensor(answer["predictions"])

    torch.testing.assert_close(served(), redone.predict_proba(x), rtol=0, atol=1e-5)
    assert publisher.served_versions() == [1, 2]
    server.stop()
    server.start()
    publisher.resync()
    assert publisher.client.default_version(MODEL) == 2
    torch.testing.assert_close(served(), redone.predict_proba(x), rtol=0, atol=1e-5)


def test_a_withdrawn_version_that_is_still_torchserves_default_is_replaced_or_refused_for_good(
    torchserve_server, tmp_path, good_and_bad
):
    """TorchServe refuses to unregister its default version while it holds others. After a withdrawal
    the deleted version stays the default until the worker's next publish or resync; a rollback to
    the redone version in that time makes the live version the default first. Where no live version
    is left to make the default, the error says so once instead of being retried for ever."""
    good, bad, sample = good_and_bad
    server = torchserve_server()
    publisher = publisher_for(server, tmp_path, promotion_margin=1.0)
    save_version(publisher.store, 1, good, sample)
    save_version(publisher.store, 2, new_learner(seed=5), sample)
    publisher.publish(1)
    publisher.publish(2)

    def without_previous() -> None:
        """As live.json was written before it had the field."""
        written = json.loads(publisher.pointer.path.read_text())
        del written["previous"]
        publisher.pointer.path.write_text(json.dumps(written))

    without_previous()
    drop_uncommitted_checkpoints(publisher.store, 1)
    assert publisher.live_version() == 1
    assert publisher.client.default_version(MODEL) == 2
    save_version(publisher.store, 2, bad, sample)
    assert publisher.rollback(2) == 1
    assert publisher.client.default_version(MODEL) == 2
    status, answer = predict(server, json.dumps({"instances": sample.x[:4].tolist()}).encode())
    assert status == 200, answer
    torch.testing.assert_close(torch.tensor(answer["predictions"]), bad.predict_proba(sample.x[:4]), rtol=0, atol=1e-5)

    shutil.rmtree(publisher.store.path(1))  # no version below the withdrawn one is left
    without_previous()
    drop_uncommitted_checkpoints(publisher.store, 1)
    assert publisher.live_version() is None
    save_version(publisher.store, 2, good, sample)
    with pytest.raises(PublishError, match="TorchServe's default but was registered from a deleted checkpoint") as err:
        publisher.publish(2)
    assert not err.value.retry


@pytest.mark.skipif(not java_available(), reason="TorchServe needs Java 17: no java on PATH or in $JAVA_HOME/bin")
def test_alma_serve_starts_a_token_protected_torchserve_the_publisher_can_use(tmp_path, good_and_bad, capsys):
    good, _, sample = good_and_bad
    inference, management, metrics = free_ports(3)
    config = [
        "--set",
        f"daemon.state_dir={tmp_path / 'state'}",
        "--set",
        f"daemon.checkpoint_dir={tmp_path / 'ms'}",
        "--set",
        "serving.kind=torchserve",
        "--set",
        "serving.token_auth=true",
        "--set",
        f"serving.inference_url=http://127.0.0.1:{inference}",
        "--set",
        f"serving.management_url=http://127.0.0.1:{management}",
        "--set",
        f"serving.metrics_url=http://127.0.0.1:{metrics}",
        # At the default niceness 19 a worker beside other CPU-bound jobs loads for minutes, past the
        # registration timeout: this test is about tokens, not about yielding the cores.
        "--set",
        "serving.niceness=0",
    ]
    assert main(["serve", *config]) == 0
    try:
        printed = capsys.readouterr().out
        assert f"http://127.0.0.1:{inference}" in printed and "key_file.json" in printed
        status, _ = http_request("GET", f"http://127.0.0.1:{management}/models")
        assert status == 400, "token authorization must be on"

        publisher = make_publisher(
            build_config(
                {"daemon": {"state_dir": str(tmp_path / "state"), "checkpoint_dir": str(tmp_path / "ms")}},
                [c for c in config[1::2] if c.startswith("serving.")],
            )
        )
        save_version(publisher.store, 1, good, sample)
        # An invalid management key is renewed through TorchServe's token API with the API key.
        key_file = tmp_path / "state" / "torchserve" / "key_file.json"
        keys = json.loads(key_file.read_text())
        keys["management"]["key"] = "expired"
        key_file.write_text(json.dumps(keys))
        assert publisher.publish(1).action == "promoted"
        assert json.loads(key_file.read_text())["management"]["key"] != "expired"
        status, _ = http_request("GET", f"http://127.0.0.1:{metrics}/metrics")
        assert status == 200
    finally:
        assert main(["serve", *config, "--stop"]) == 0
    assert "TorchServe stopped" in capsys.readouterr().out
    assert http_request_fails(f"http://127.0.0.1:{inference}/ping")
