"""Publishing to a real KServe model server over the Open Inference Protocol v2 (``serving.kind: kserve``;
started by the ``kserve_server`` fixture; no mocks).

Skipped only where ``kserve`` is not installed. Each test starts its own server over its own model
store, so a test that kills the server cannot disturb another.
"""

from __future__ import annotations

import dataclasses
import json
import time
from pathlib import Path

import pytest
import torch

from alma_daemon.cli import main
from alma_daemon.config import Config, build_config
from alma_daemon.data.datasets import MNIST_TASK, TaskInfo
from alma_daemon.data.tensors import LabeledData
from alma_daemon.data.text import WordVocabulary, sequences
from alma_daemon.learners import build_learner
from serving.protocols.codecs import codec_for
from serving.protocols.version_names import read_default
from serving.publishing import make_publisher
from serving.publishing.background import BackgroundPublisher
from serving.publishing.live_pointer import withdraw
from serving.publishing.oip import OipPublisher
from serving.runtimes.bundled_model import BUNDLED_SOURCE
from tests.helpers.configs import learner_settings
from tests.helpers.data import separable_data
from tests.helpers.servers import KServeServer, free_port, http_request
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

#: A team's own network (bundled beside the checkpoint: the server, which runs outside the repository,
#: cannot import ``tests``) on standardized features, asked by the names of its features and answering
#: by the names of its classes.
USER_MLP = "tests.helpers.user_models:tabular_mlp"
FEATURE_NAMES = [f"f{i:02d}" for i in range(FEATURES.input_shape[0])]
FEATURE_TASK = dataclasses.replace(
    FEATURES.with_statistics(feature_data(200, seed=0).x),
    classes=("low", "mid", "high"),
    extra={"features": FEATURE_NAMES},
)

#: Learner families the server must answer for: (learner name, task, learner config, train then grow
#: before saving).
ROUND_TRIP = [
    pytest.param("sm", MNIST_TASK, {}, False, id="sm-mnist"),
    pytest.param("gmoe", MNIST_TASK, {}, True, id="grown-gmoe-mnist"),
    pytest.param("switch-lm", LM_TASK, TINY_LM, False, id="switch-lm-text"),
    pytest.param("ens", FEATURE_TASK, {"model": USER_MLP}, False, id="ens-user-model-features"),
]


def sample_for(task: TaskInfo, n: int) -> LabeledData:
    if task.kind == "language_model":
        tokens = sequences(WORDS.encode(TEXT), task.input_shape[0])
        # x and y are views of one tensor; safetensors refuses to save tensors sharing memory.
        return LabeledData(tokens.x[:n].clone(), tokens.y[:n].clone())
    return separable_data(task, n, seed=3) if task.pixels else feature_data(n, seed=3)


def kserve_config(url: str, store_root: Path, **serving) -> Config:
    return build_config(
        {
            "daemon": {"checkpoint_dir": str(store_root)},
            "serving": {"kind": "kserve", "model_name": MODEL, "inference_url": url, **serving},
        }
    )


def publisher_for(url: str, store_root: Path, **serving) -> OipPublisher:
    publisher = make_publisher(kserve_config(url, store_root, **serving))
    assert isinstance(publisher, OipPublisher)
    return publisher


def started(kserve_server, tmp_path: Path, **serving) -> tuple[KServeServer, OipPublisher]:
    """A server over ``tmp_path``'s model store, and a publisher to it."""
    store_root = tmp_path / "model_store"
    server = kserve_server(store_root, MODEL)
    return server, publisher_for(
        server.inference_url, store_root, repository_token_file=str(server.token_file), **serving
    )


def infer(server: KServeServer, request: dict, name: str = MODEL) -> tuple[int, dict]:
    status, answer = http_request(
        "POST",
        f"{server.inference_url}/v2/models/{name}/infer",
        json.dumps(request).encode(),
        {"Content-Type": "application/json"},
    )
    return status, json.loads(answer)


def served_answer(server: KServeServer, x: torch.Tensor) -> tuple[str, torch.Tensor]:
    """The served version and its probabilities for MNIST examples ``x``."""
    codec = codec_for(MNIST_TASK)
    status, answer = infer(server, codec.encode_oip(x))
    assert status == 200, answer
    return answer["model_version"], codec.decode_oip(answer)


def ready(server: KServeServer, name: str) -> int:
    return http_request("GET", f"{server.inference_url}/v2/models/{name}/ready", timeout=10)[0]


def bad_pixel_requests(x: torch.Tensor) -> dict[str, dict]:
    """Requests for one MNIST example ``x`` that a server must refuse, by the words of its refusal."""

    def tensor(datatype: str, data: list, shape: list[int] | None = None, name: str = "x") -> dict:
        return {"name": name, "datatype": datatype, "shape": shape or [1, 28, 28], "data": data}

    pixels = x.reshape(-1).tolist()
    return {
        "values must be raw units in [0, 255]": {"inputs": [tensor("FP32", (x / 255 - 0.5).reshape(-1).tolist())]},
        "each example must have shape [28, 28]": {"inputs": [tensor("FP32", [1.0, 2.0, 3.0], [1, 3])]},
        "examples must be numbers, not BYTES": {"inputs": [tensor("BYTES", [str(p) for p in pixels])]},
        "expected one input tensor of examples": {
            "inputs": [tensor("UINT8", pixels), tensor("UINT8", pixels, name="y")]
        },
        "does not fit its shape and datatype": {"inputs": [tensor("UINT8", pixels, [2, 28, 28])]},
        "out of bounds for uint8": {"inputs": [tensor("UINT8", [300] * 784)]},
    }


@pytest.mark.parametrize("name,task,overrides,grow", ROUND_TRIP)
def test_served_answers_equal_the_learner_in_process(kserve_server, tmp_path, name, task, overrides, grow):
    server, publisher = started(kserve_server, tmp_path)
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

    request = codec.encode_oip(sample.x)
    status, answer = infer(server, request)
    assert status == 200, answer
    assert (answer["model_name"], answer["model_version"]) == (MODEL, "1")
    torch.testing.assert_close(
        codec.decode_oip(answer), codec.answer_oip_in_process(learner, request), rtol=0, atol=1e-5
    )
    if task.kind == "classification":
        torch.testing.assert_close(codec.decode_oip(answer), learner.predict_proba(sample.x), rtol=0, atol=1e-5)
    if task == MNIST_TASK:
        # The codec's own line, or the protocol's where a tensor cannot be read; never a server error.
        for words, bad in bad_pixel_requests(sample.x[:1]).items():
            status, answer = infer(server, bad)
            assert status == 400 and words in answer["error"], (words, status, answer)
    if task.classes:  # a team's task: one tensor per named feature in, its class names out
        assert (publisher.store.path(1) / BUNDLED_SOURCE).is_file()
        by_feature = [
            {"name": n, "datatype": "FP32", "shape": [len(sample)], "data": sample.x[:, i].tolist()}
            for i, n in enumerate(FEATURE_NAMES)
        ]
        status, answer = infer(server, {"inputs": by_feature})
        assert status == 200, answer
        expected = learner.predict_proba(sample.x)
        torch.testing.assert_close(codec.decode_oip(answer), expected, rtol=0, atol=1e-5)
        (names,) = [o["data"] for o in answer["outputs"] if o["name"] == "class"]
        assert names == [task.classes[i] for i in expected.argmax(1).tolist()]
        status, answer = infer(server, {"inputs": by_feature[1:]})
        assert status == 400 and "fields missing ['f00']" in answer["error"], answer
    if task.kind == "language_model":
        status, answer = infer(server, {**request, "parameters": {"top_k": 3}})
        assert status == 200, answer
        shapes = {o["name"]: o["shape"] for o in answer["outputs"]}
        assert shapes == {"tokens": [16, 3], "probabilities": [16, 3], "texts": [16, 3]}
        status, answer = infer(server, {**request, "parameters": {"top_k": 0}})
        assert status == 400 and "top_k must be an integer in [1, 1000]" in answer["error"], answer


def test_publish_loads_each_version_under_its_name_makes_it_the_default_and_unloads_old_ones(
    kserve_server, tmp_path, good_and_bad
):
    good, _, sample = good_and_bad
    server, publisher = started(kserve_server, tmp_path, keep_versions=1, promotion_margin=0.0)
    swaps_before = metric_value("alma_swaps_total")
    seen = []
    for version in (1, 2, 3):
        save_version(publisher.store, version, good, sample)
        assert publisher.publish(version).action == "promoted"
        served_version, _ = served_answer(server, sample.x[:2])
        seen.append((publisher.served_versions(), read_default(publisher.store.folder), served_version))
        assert metric_value("alma_live_model_version") == version
    assert seen == [([1], 1, "1"), ([1, 2], 2, "2"), ([2, 3], 3, "3")]
    assert publisher.live_version() == 3
    assert sorted(publisher.client.models()) == [MODEL, f"{MODEL}-v2", f"{MODEL}-v3"]
    assert ready(server, f"{MODEL}-v1") == 404
    assert metric_value("alma_swaps_total") == swaps_before + 3


def test_metadata_names_the_tensors_a_v1_request_is_told_the_route_and_one_name_unloaded_leaves_the_other(
    kserve_server, tmp_path, good_and_bad
):
    good, _, sample = good_and_bad
    server, publisher = started(kserve_server, tmp_path)
    save_version(publisher.store, 1, good, sample)
    publisher.publish(1)

    status, body = http_request("GET", f"{server.inference_url}/v2/models/{MODEL}")
    metadata = json.loads(body)
    assert status == 200
    assert metadata["inputs"] == [{"name": "x", "datatype": "FP32", "shape": [-1, 28, 28]}]
    assert metadata["outputs"] == [{"name": "probabilities", "datatype": "FP32", "shape": [-1, 10]}]

    status, body = http_request(
        "POST",
        f"{server.inference_url}/v1/models/{MODEL}:predict",
        json.dumps({"instances": sample.x[:1].tolist()}).encode(),
        {"Content-Type": "application/json"},
    )
    assert status == 400 and "POST /v2/models/<name>/infer" in json.loads(body)["error"]

    # The default and its version are one object: unloading either name leaves the other answering.
    publisher.client.unload(MODEL)
    assert ready(server, f"{MODEL}-v1") == 200
    publisher.resync()
    publisher.client.unload(f"{MODEL}-v1")
    assert ready(server, MODEL) == 200
    assert served_answer(server, sample.x[:2])[0] == "1"


def test_guard_refuses_a_worse_version_which_is_never_loaded(kserve_server, tmp_path, good_and_bad):
    good, bad, sample = good_and_bad
    server, publisher = started(kserve_server, tmp_path, promotion_margin=0.05)
    save_version(publisher.store, 1, good, sample)
    save_version(publisher.store, 2, bad, sample)
    publisher.publish(1)
    refused_before = metric_value("alma_promotions_refused_total")
    assert publisher.publish(2).action == "refused"
    assert publisher.served_versions() == [1]
    assert f"{MODEL}-v2" not in publisher.client.models()
    assert read_default(publisher.store.folder) == 1
    version, answers = served_answer(server, sample.x[:4])
    assert version == "1"
    torch.testing.assert_close(answers, good.predict_proba(sample.x[:4]), rtol=0, atol=1e-5)
    assert metric_value("alma_promotions_refused_total") == refused_before + 1


def test_rollback_loads_an_unloaded_version_again_and_versions_lists_it_live(
    kserve_server, tmp_path, good_and_bad, capsys
):
    good, bad, sample = good_and_bad
    server, publisher = started(kserve_server, tmp_path, keep_versions=0, promotion_margin=1.0)
    save_version(publisher.store, 1, good, sample)
    save_version(publisher.store, 2, bad, sample)
    publisher.publish(1)
    publisher.publish(2)
    assert publisher.served_versions() == [2]
    config = [
        "--set",
        f"daemon.checkpoint_dir={publisher.store.root}",
        "--set",
        "serving.kind=kserve",
        "--set",
        f"serving.inference_url={server.inference_url}",
        "--set",
        f"serving.repository_token_file={server.token_file}",
        "--set",
        "serving.keep_versions=0",
    ]

    assert main(["rollback", *config, "--to", "1"]) == 0
    assert "version 1 is live (was 2)" in capsys.readouterr().out
    assert publisher.live_version() == 1
    assert publisher.served_versions() == [1]
    version, answers = served_answer(server, sample.x[:4])
    assert version == "1"
    torch.testing.assert_close(answers, good.predict_proba(sample.x[:4]), rtol=0, atol=1e-5)

    assert main(["versions", *config, "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert [(r["version"], r["live"], r["registered"]) for r in rows] == [(1, True, True), (2, False, False)]


def test_clients_see_no_failure_during_ten_swaps(kserve_server, tmp_path, good_and_bad):
    _, _, sample = good_and_bad
    # keep_versions=0: each demoted version is unloaded right away, the riskiest case.
    server, publisher = started(kserve_server, tmp_path, keep_versions=0, promotion_margin=1.0)
    for version in range(1, 12):
        save_version(publisher.store, version, new_learner(seed=version), sample)
    publisher.publish(1)
    request = codec_for(MNIST_TASK).encode_oip(sample.x[:4])
    versions: list[list[int]] = [[] for _ in range(4)]

    def ask(client: int) -> str:
        status, answer = infer(server, request)
        shapes = [o["shape"] for o in answer.get("outputs", [])]
        if status == 200:
            versions[client].append(int(answer["model_version"]))
        return "ok" if status == 200 and shapes == [[4, 10]] else f"{status}: {answer}"

    def swaps() -> None:
        for version in range(2, 12):
            assert publisher.publish(version).action == "promoted"

    answers = clients_during(ask, swaps)
    failures = [a for log in answers for a in log if a != "ok"]
    assert failures == []
    assert all(len(log) > 0 for log in answers)
    # One client's requests, each sent after the last was answered, never go back to an older version.
    assert all(seen == sorted(seen) for seen in versions)
    assert publisher.served_versions() == [11]
    assert served_answer(server, sample.x[:1])[0] == "11"


def test_publishing_is_retried_while_the_server_is_down_and_a_restarted_server_serves_the_default_at_once(
    kserve_server, tmp_path, good_and_bad
):
    good, _, sample = good_and_bad
    server, publisher = started(kserve_server, tmp_path, promotion_margin=1.0)
    worker = BackgroundPublisher(publisher, retry_initial_seconds=0.2, retry_max_seconds=1.0).start()
    try:
        save_version(publisher.store, 1, good, sample)
        worker.submit(1)
        assert worker.wait_idle(timeout=120)
        assert publisher.live_version() == 1

        server.kill()  # SIGKILL: a crash
        failures_before = metric_value("alma_swap_failures_total", stage="register")
        save_version(publisher.store, 2, good, sample)
        worker.submit(2)
        deadline = time.monotonic() + 60  # a safety limit, not a timing check
        while metric_value("alma_swap_failures_total", stage="register") < failures_before + 2:
            assert time.monotonic() < deadline, "no failed attempt was counted while the server was down"
            time.sleep(0.1)
        assert publisher.live_version() == 1

        # Holding the serving lock keeps the worker from publishing until the restarted server was asked.
        with publisher.pointer.locked():
            server.start()
            assert ready(server, MODEL) == 200, "the restarted server must serve the recorded default at its start"
            assert ready(server, f"{MODEL}-v2") == 404
            version, answers = served_answer(server, sample.x[:4])
            assert version == "1"
            torch.testing.assert_close(answers, good.predict_proba(sample.x[:4]), rtol=0, atol=1e-5)
        assert worker.wait_idle(timeout=180)
    finally:
        worker.close()
    assert publisher.live_version() == 2
    assert read_default(publisher.store.folder) == 2
    assert served_answer(server, sample.x[:1])[0] == "2"
    assert publisher.served_versions() == [1, 2]


def test_a_version_withdrawn_and_redone_under_the_same_number_serves_its_new_weights(
    kserve_server, tmp_path, good_and_bad
):
    """Redis lost the commit of version 2's step after version 2 was published: the restarted daemon
    withdraws version 2 and redoes the step, whose weights may differ. The server still holds the
    withdrawn version under ``alma-v2``; the redone one must replace it."""
    good, bad, sample = good_and_bad
    server, publisher = started(kserve_server, tmp_path, promotion_margin=1.0)
    first, redone = new_learner(seed=5), bad
    x = sample.x[:4]
    assert (first.predict_proba(x) - redone.predict_proba(x)).abs().max() > 1e-2
    save_version(publisher.store, 1, good, sample)
    save_version(publisher.store, 2, first, sample)
    publisher.publish(1)
    publisher.publish(2)
    torch.testing.assert_close(served_answer(server, x)[1], first.predict_proba(x), rtol=0, atol=1e-5)

    withdraw(publisher.store, 2)
    assert publisher.live_version() == 1
    publisher.resync()  # what the worker does first when it starts: version 1 serves by default again
    version, answers = served_answer(server, x)
    assert version == "1"
    torch.testing.assert_close(answers, good.predict_proba(x), rtol=0, atol=1e-5)

    save_version(publisher.store, 2, redone, sample)
    assert publisher.publish(2).action == "promoted"
    version, answers = served_answer(server, x)
    assert version == "2"
    torch.testing.assert_close(answers, redone.predict_proba(x), rtol=0, atol=1e-5)
    status, answer = infer(server, codec_for(MNIST_TASK).encode_oip(x), f"{MODEL}-v2")
    assert status == 200, answer
    torch.testing.assert_close(codec_for(MNIST_TASK).decode_oip(answer), redone.predict_proba(x), rtol=0, atol=1e-5)
    assert publisher.served_versions() == [1, 2]


def test_alma_serve_starts_a_kserve_server_the_publisher_can_use_and_stops_it(tmp_path, good_and_bad, capsys):
    pytest.importorskip("kserve", reason="KServe's model server is not installed: pip install 'alma-daemon[kserve]'")
    good, _, sample = good_and_bad
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    config = [
        "--set",
        f"daemon.state_dir={tmp_path / 'state'}",
        "--set",
        f"daemon.checkpoint_dir={tmp_path / 'ms'}",
        "--set",
        "serving.kind=kserve",
        "--set",
        f"serving.inference_url={url}",
        # At the default niceness 19 beside other CPU-bound jobs the start is slow: this test is about
        # the command, not about yielding the cores.
        "--set",
        "serving.niceness=0",
    ]
    assert main(["serve", "--kind", "kserve", *config]) == 0
    try:
        printed = capsys.readouterr().out
        assert "KServe's model server started" in printed
        assert f"{url}/v2/models/{MODEL}/infer" in printed
        assert (tmp_path / "state" / "kserve" / "kserve.pid").is_file()
        assert http_request("GET", f"{url}/v2/health/live")[0] == 200
        assert main(["serve", "--kind", "kserve", *config]) == 1
        assert "KServe's model server already runs from" in capsys.readouterr().err

        publisher = make_publisher(
            build_config(
                {"daemon": {"state_dir": str(tmp_path / "state"), "checkpoint_dir": str(tmp_path / "ms")}},
                [c for c in config[1::2] if c.startswith("serving.")],
            )
        )
        assert isinstance(publisher, OipPublisher)
        save_version(publisher.store, 1, good, sample)
        assert publisher.publish(1).action == "promoted"
        codec = codec_for(MNIST_TASK)
        status, answer = http_request(
            "POST",
            f"{url}/v2/models/{MODEL}/infer",
            json.dumps(codec.encode_oip(sample.x[:4])).encode(),
            {"Content-Type": "application/json"},
        )
        assert status == 200, answer
        torch.testing.assert_close(
            codec.decode_oip(json.loads(answer)), good.predict_proba(sample.x[:4]), rtol=0, atol=1e-5
        )
    finally:
        assert main(["serve", "--kind", "kserve", *config, "--stop"]) == 0
    assert "KServe's model server stopped" in capsys.readouterr().out
    assert not (tmp_path / "state" / "kserve" / "kserve.pid").exists()
    with pytest.raises(OSError):
        http_request("GET", f"{url}/v2/health/live", timeout=2)
