"""Triton Inference Server (``serving.kind: triton``): its model repository written per version, its
Python backend rebuilding checkpoints, and the Open Inference Protocol publisher driving a real Triton.

The repository's files and the backend model's answers are checked in process (no server). The
``integration`` tests share one Triton for the module (``triton``, from nvidia-pytriton in
scripts/setup_triton.sh's virtualenv; skipped, saying why, without it), each over a model name of
its own in one model store, since loading a version starts a process that imports torch (seconds);
the test that restarts the server comes last. ``alma serve --kind triton`` starts a second one.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
from collections.abc import Iterable, Iterator

import pytest
import torch

from alma_daemon.cli import main
from alma_daemon.config import build_config
from alma_daemon.core.checkpoints import CheckpointStore
from alma_daemon.data.datasets import MNIST_TASK, TaskInfo
from alma_daemon.data.tensors import LabeledData
from alma_daemon.data.text import WordVocabulary, sequences
from alma_daemon.learners import Learner, build_learner
from alma_daemon.local_servers.processes import ServerNotInstalled
from alma_daemon.local_servers.triton import TritonServer
from alma_daemon.local_servers.triton_install import PYTHON_ENV, TritonInstall, triton_python
from alma_daemon.testing import Backend, yield_publisher_checks
from serving.protocols.codecs import codec_for
from serving.protocols.version_names import read_default, version_of
from serving.publishing import make_publisher
from serving.publishing.live_pointer import withdraw
from serving.publishing.oip import OipClient, OipError
from serving.publishing.triton import TritonPublisher
from serving.runtimes.triton.repository import (
    BYTECODE_BLOCKER,
    CONFIG,
    MODEL_FILE,
    MODEL_SOURCE,
    TritonRepository,
    check_name,
    repository_root,
)
from serving.runtimes.triton.served import ServedVersion
from tests.helpers.configs import learner_settings
from tests.helpers.data import separable_data
from tests.helpers.servers import free_port, http_request
from tests.helpers.serving import CHECKS, clients_during, metric_value, new_learner, save_version
from tests.helpers.user_models import FEATURES, feature_data

TEXT = "the cat sat on the mat\nthe dog sat on the log\na cat and a dog\n" * 8
WORDS = WordVocabulary.from_text(TEXT)
LM_TASK = TaskInfo(
    "language_model", (8,), WORDS.vocab_size, extra={"vocab_size": WORDS.vocab_size, "tokenizer": WORDS.to_dict()}
)
TINY_LM = {"layers": 1, "d_model": 16, "heads": 2, "d_ff": 32, "experts": 2}
#: A team's own network, bundled beside the checkpoint, asked by the names of its features.
USER_MLP = "tests.helpers.user_models:tabular_mlp"
FEATURE_NAMES = [f"f{i:02d}" for i in range(FEATURES.input_shape[0])]
FEATURE_TASK = dataclasses.replace(
    FEATURES.with_statistics(feature_data(200, seed=0).x),
    classes=("low", "mid", "high"),
    extra={"features": FEATURE_NAMES},
)
NAMES = itertools.count()


def sample_for(task: TaskInfo, n: int) -> LabeledData:
    if task.kind == "language_model":
        tokens = sequences(WORDS.encode(TEXT), task.input_shape[0])
        return LabeledData(tokens.x[:n].clone(), tokens.y[:n].clone())
    return separable_data(task, n, seed=3) if task.pixels else feature_data(n, seed=3)


def learner_for(name: str, task: TaskInfo, overrides: dict | None = None) -> Learner:
    return build_learner(name, task, learner_settings(name, {"width": 8, "members": 2}, overrides or {}), 0)


# -- the repository, in process -------------------------------------------------------------------


def test_each_version_is_a_python_model_and_the_default_an_ensemble_of_it(tmp_path):
    store = CheckpointStore(tmp_path, "alma")
    sample = sample_for(MNIST_TASK, 8)
    save_version(store, 7, new_learner(), sample)
    repository = TritonRepository(store)
    repository.write_version(7)
    repository.write_default(7)

    root = repository_root(tmp_path)
    assert root == tmp_path / "triton_repository"
    version = (root / "alma-v7" / CONFIG).read_text()
    assert 'name: "alma-v7"\nbackend: "python"\nmax_batch_size: 0\n' in version
    assert "version_policy: { specific: { versions: [ 7 ] } }" in version
    # Raw pixels in: UINT8, as clients and the probe send them; all inputs optional (the codec says what is missing).
    assert '{ name: "x" data_type: TYPE_UINT8 dims: [ -1, 28, 28 ] optional: true }' in version
    assert '{ name: "probabilities" data_type: TYPE_FP32 dims: [ -1, 10 ] }' in version
    assert 'parameters: { key: "alma_model" value: { string_value: "alma" } }' in version
    assert (root / "alma-v7" / "7" / MODEL_FILE).read_text() == MODEL_SOURCE
    # A file where Python would make its bytecode folder: the folder stays as written.
    assert (root / "alma-v7" / "7" / BYTECODE_BLOCKER).is_file()
    default = (root / "alma" / CONFIG).read_text()
    assert 'platform: "ensemble"' in default and "versions: [ 7 ]" in default
    assert 'model_name: "alma-v7" model_version: -1' in default
    assert 'input_map { key: "x" value: "x" }' in default
    assert 'output_map { key: "probabilities" value: "probabilities" }' in default
    assert sorted(p.name for p in (root / "alma").iterdir()) == ["7", CONFIG]
    assert repository.default_version() == 7

    # Nothing changes where nothing would (Triton reloads a model whose files changed) ...
    files = [p for p in root.rglob("*") if p.is_file()]
    times = {p: p.stat().st_mtime_ns for p in files}
    repository.write_version(7)
    repository.write_default(7)
    assert {p: p.stat().st_mtime_ns for p in files} == times
    # ... but a version redone under the same number has another fingerprint: loaded again.
    withdraw(store, 7)
    save_version(store, 7, new_learner(seed=1), sample)
    repository.write_version(7)
    assert (root / "alma-v7" / CONFIG).read_text() != version

    save_version(store, 8, new_learner(), sample)
    repository.write_version(8)
    repository.write_default(8)
    assert sorted(p.name for p in (root / "alma").iterdir()) == ["8", CONFIG]
    assert repository.remove_versions({"alma", "alma-v8"}) == [7]
    assert sorted(p.name for p in root.iterdir()) == ["alma", "alma-v8"]


def test_tasks_declare_their_own_tensors(tmp_path):
    store = CheckpointStore(tmp_path, "team")
    save_version(store, 1, learner_for("ens", FEATURE_TASK, {"model": USER_MLP}), sample_for(FEATURE_TASK, 16))
    TritonRepository(store).write_version(1)
    config = (repository_root(tmp_path) / "team-v1" / CONFIG).read_text()
    # One tensor per named feature, or one of examples; the class names out.
    assert '{ name: "f00" data_type: TYPE_FP32 dims: [ -1 ] optional: true }' in config
    assert f'{{ name: "x" data_type: TYPE_FP32 dims: [ -1, {len(FEATURE_NAMES)} ] optional: true }}' in config
    assert '{ name: "class" data_type: TYPE_STRING dims: [ -1 ] }' in config

    store = CheckpointStore(tmp_path, "lm")
    save_version(store, 1, learner_for("switch-lm", LM_TASK, TINY_LM), sample_for(LM_TASK, 8))
    TritonRepository(store).write_version(1)
    config = (repository_root(tmp_path) / "lm-v1" / CONFIG).read_text()
    assert '{ name: "text" data_type: TYPE_STRING dims: [ -1 ] optional: true }' in config
    assert '{ name: "tokens" data_type: TYPE_INT64 dims: [ -1, -1 ] }' in config
    with pytest.raises(FileNotFoundError, match="no checkpoint version 9"):
        TritonRepository(store).write_version(9)


@pytest.mark.parametrize("name", ["", "a/b", "..", 'say "hi"'])
def test_a_model_name_that_cannot_be_a_folder_is_refused(name):
    with pytest.raises(ValueError, match="serving.model_name: .* cannot name a folder of Triton's model repository"):
        check_name(name)


def test_the_backend_model_rebuilds_its_checkpoint_and_answers_as_the_learner(tmp_path):
    """What the Python backend's ``initialize`` and ``execute`` do, without the backend."""
    learner, sample = learner_for("ens", FEATURE_TASK, {"model": USER_MLP}), sample_for(FEATURE_TASK, 16)
    save_version(CheckpointStore(tmp_path, "team"), 3, learner, sample)
    config = {"parameters": {"alma_model": {"string_value": "team"}}}
    args = {
        "model_config": json.dumps(config),
        "model_version": "3",
        "model_repository": str(repository_root(tmp_path) / "team-v3"),
        "model_instance_kind": "CPU",
    }
    served = ServedVersion.from_backend_args(args)
    assert served.version == 3
    columns = {name: sample.x[:, i].numpy() for i, name in enumerate(FEATURE_NAMES)}
    (probabilities, classes) = served.answer(columns, '{"unused": 1}')
    torch.testing.assert_close(torch.from_numpy(probabilities.data), learner.predict_proba(sample.x), rtol=0, atol=1e-6)
    assert classes.name == "class" and len(classes.data) == len(sample)
    with pytest.raises(ValueError, match=r"fields missing \['f00'\]"):
        served.answer({name: columns[name] for name in FEATURE_NAMES[1:]}, "{}")
    with pytest.raises(ValueError, match="parameters are not JSON"):
        served.answer(columns, "{")


def test_a_missing_install_is_one_line_naming_the_setup_script(tmp_path, monkeypatch, capsys):
    missing = tmp_path / "nowhere" / "python"
    with pytest.raises(
        ServerNotInstalled, match=r"Triton is not installed: no .*nowhere/python; run scripts/setup_triton.sh"
    ):
        TritonInstall.find(missing)
    monkeypatch.setenv(PYTHON_ENV, str(missing))
    args = [
        "serve",
        "--kind",
        "triton",
        "--set",
        f"daemon.state_dir={tmp_path / 'state'}",
        "--set",
        "serving.kind=triton",
    ]
    assert main(args) == 1
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert line.startswith("alma serve: error: --kind triton (serving.kind): Triton is not installed: no ")


# -- a real Triton ---------------------------------------------------------------------------------


def installed() -> bool:
    try:
        TritonInstall.find(triton_python())
    except ServerNotInstalled:
        return False
    return True


@pytest.fixture(scope="module")
def triton(tmp_path_factory) -> Iterator[TritonServer]:
    """One Triton for the module, over one model store (the tests' models are names in it), stopped at the end."""
    if not installed():
        pytest.skip(
            f"Triton's virtualenv is missing: no {triton_python()} (run scripts/setup_triton.sh, or set {PYTHON_ENV})"
        )
    root = tmp_path_factory.mktemp("triton")
    server = TritonServer(root / "server", root / "model_store", "restarted")
    server.start()
    try:
        yield server
    finally:
        server.stop()


def publisher_for(server: TritonServer, model: str | None = None, **serving) -> TritonPublisher:
    """A publisher of a model of its own (``model``, else a fresh name) on the module's server."""
    config = build_config(
        {
            "daemon": {"checkpoint_dir": str(server.store_root)},
            "serving": {"model_name": model or f"m{next(NAMES)}", **server.publisher_settings(), **serving},
        }
    )
    publisher = make_publisher(config)
    assert isinstance(publisher, TritonPublisher)
    return publisher


def ours(model: str, names: Iterable[str]) -> list[str]:
    """The names of ``model`` among ``names`` (the module's server holds every test's models)."""
    return [name for name in names if name == model or version_of(model, name) is not None]


def infer(server: TritonServer, name: str, request: dict) -> tuple[int, dict]:
    status, answer = http_request(
        "POST",
        f"{server.inference_url}/v2/models/{name}/infer",
        json.dumps(request).encode(),
        {"Content-Type": "application/json"},
    )
    return status, json.loads(answer)


def served_answer(server: TritonServer, name: str, x: torch.Tensor) -> tuple[str, torch.Tensor]:
    """The version ``name`` answers with, and its probabilities for MNIST examples ``x``."""
    codec = codec_for(MNIST_TASK)
    status, answer = infer(server, name, codec.encode_oip(x))
    assert status == 200, answer
    return answer["model_version"], codec.decode_oip(answer)


@pytest.mark.integration
def test_served_answers_equal_the_learner_in_process_and_bad_requests_get_a_400(triton):
    cases = [
        ("sm", MNIST_TASK, {}),
        ("switch-lm", LM_TASK, TINY_LM),
        ("ens", FEATURE_TASK, {"model": USER_MLP}),
    ]
    for name, task, overrides in cases:
        publisher = publisher_for(triton)
        learner, sample = learner_for(name, task, overrides), sample_for(task, 16)
        save_version(publisher.store, 1, learner, sample)
        assert publisher.publish(1).action == "promoted"
        codec = codec_for(task)
        request = codec.encode_oip(sample.x)
        for served_name in (publisher.model, f"{publisher.model}-v1"):
            status, answer = infer(triton, served_name, request)
            assert status == 200, answer
            assert answer["model_version"] == "1"
            torch.testing.assert_close(
                codec.decode_oip(answer), codec.answer_oip_in_process(learner, request), rtol=0, atol=1e-5
            )
        if task.kind == "language_model":  # request parameters reach the model through the ensemble
            status, answer = infer(triton, publisher.model, {**request, "parameters": {"top_k": 3}})
            assert status == 200 and {o["name"]: o["shape"] for o in answer["outputs"]}["tokens"] == [16, 3], answer
            status, answer = infer(triton, publisher.model, {**request, "parameters": {"top_k": 0}})
            assert status == 400 and "top_k must be an integer in [1, 1000]" in answer["error"], answer
        if task.classes:  # a team's task: one tensor per named feature in, its class names out
            by_feature = [
                {"name": n, "datatype": "FP32", "shape": [len(sample)], "data": sample.x[:, i].tolist()}
                for i, n in enumerate(FEATURE_NAMES)
            ]
            status, answer = infer(triton, publisher.model, {"inputs": by_feature})
            assert status == 200, answer
            expected = learner.predict_proba(sample.x)
            (names,) = [o["data"] for o in answer["outputs"] if o["name"] == "class"]
            assert names == [task.classes[i] for i in expected.argmax(1).tolist()]
            status, answer = infer(triton, publisher.model, {"inputs": by_feature[1:]})
            assert status == 400 and "fields missing ['f00']" in answer["error"], answer
        if task == MNIST_TASK:
            pixels = sample.x[:1].reshape(-1).tolist()

            def x(datatype: str, data: list, shape: list[int] | None = None) -> dict:
                return {"inputs": [{"name": "x", "datatype": datatype, "shape": shape or [1, 28, 28], "data": data}]}

            refused = {
                # Triton's own checks, against the model's config: each names the input.
                f"inference input 'x' data-type is 'FP32', but model '{publisher.model}' expects 'UINT8'": x(
                    "FP32", pixels
                ),
                "unexpected shape for input 'x'": x("UINT8", pixels[:3], [1, 3]),
                "inference input 'x' data-type is 'BOOL'": x("BOOL", [True] * 784),
                # The codec's, through the ensemble.
                "expected one input tensor of examples": {"inputs": []},
            }
            answers = {words: infer(triton, publisher.model, request) for words, request in refused.items()}
            for words, (status, answer) in answers.items():
                assert status == 400 and words in answer["error"], (words, status, answer)
            assert served_answer(triton, publisher.model, sample.x[:2])[0] == "1"


@pytest.mark.integration
def test_each_version_loads_under_its_name_the_default_switches_and_old_ones_go(triton, good_and_bad):
    good, _, sample = good_and_bad
    publisher = publisher_for(triton, keep_versions=1, promotion_margin=0.0)
    model, root = publisher.model, publisher.repository.root
    swaps_before = metric_value("alma_swaps_total")
    seen = []
    for version in (1, 2, 3):
        save_version(publisher.store, version, good, sample)
        assert publisher.publish(version).action == "promoted"
        served, answers = served_answer(triton, model, sample.x[:4])
        torch.testing.assert_close(answers, good.predict_proba(sample.x[:4]), rtol=0, atol=1e-5)
        seen.append((publisher.served_versions(), read_default(publisher.store.folder), served))
    assert seen == [([1], 1, "1"), ([1, 2], 2, "2"), ([2, 3], 3, "3")]
    names = [model, f"{model}-v2", f"{model}-v3"]
    assert sorted(ours(model, publisher.client.models())) == names
    assert not publisher.client.model_ready(f"{model}-v1")
    # The repository keeps the folders of the loaded names only.
    assert sorted(ours(model, (p.name for p in root.iterdir()))) == names
    assert metric_value("alma_swaps_total") == swaps_before + 3

    # A rollback to a loaded version switches the ensemble: nothing is loaded again.
    log_before = triton.log_path.read_text()
    publisher.rollback(2)
    assert served_answer(triton, model, sample.x[:1])[0] == "2"
    loaded_since = triton.log_path.read_text()[len(log_before) :]
    assert f"loading: {model}-v" not in loaded_since and f"loading: {model}:2" in loaded_since


@pytest.mark.integration
def test_the_model_repository_answers_only_the_token(triton, good_and_bad):
    good, _, sample = good_and_bad
    publisher = publisher_for(triton)
    save_version(publisher.store, 1, good, sample)
    publisher.publish(1)
    model = publisher.model
    for path in (
        f"/v2/repository/models/{model}/unload",
        f"/v2/repository/models/{model}/load",
        "/v2/repository/index",
    ):
        for headers in ({}, {"Authorization": "Bearer wrong"}):
            status, body = http_request("POST", triton.inference_url + path, b"{}", headers)
            assert status == 403 and b"restricted" in body, (path, headers, status, body)
    assert served_answer(triton, model, sample.x[:2])[0] == "1"
    assert http_request("GET", f"{triton.inference_url}/v2/health/ready")[0] == 200
    # The publisher's client without the token is told what to point where.
    with pytest.raises(OipError, match="403"):
        OipClient(triton.inference_url).unload(model)


@pytest.mark.integration
def test_clients_see_no_failure_during_swaps(triton, good_and_bad):
    _, _, sample = good_and_bad
    # keep_versions=0: each demoted version is unloaded right away, the riskiest case.
    publisher = publisher_for(triton, keep_versions=0, promotion_margin=1.0)
    for version in range(1, 7):
        save_version(publisher.store, version, new_learner(seed=version), sample)
    publisher.publish(1)
    request = codec_for(MNIST_TASK).encode_oip(sample.x[:4])
    versions: list[list[int]] = [[] for _ in range(4)]

    def ask(client: int) -> str:
        status, answer = infer(triton, publisher.model, request)
        shapes = [o["shape"] for o in answer.get("outputs", [])]
        if status == 200:
            versions[client].append(int(answer["model_version"]))
        return "ok" if status == 200 and shapes == [[4, 10]] else f"{status}: {answer}"

    def swaps() -> None:
        for version in range(2, 7):
            assert publisher.publish(version).action == "promoted"

    answers = clients_during(ask, swaps)
    assert [a for log in answers for a in log if a != "ok"] == []
    assert all(len(log) > 0 for log in answers)
    # One client's requests, each sent after the last was answered, never go back to an older version.
    assert all(seen == sorted(seen) for seen in versions)
    assert publisher.served_versions() == [6]
    assert served_answer(triton, publisher.model, sample.x[:1])[0] == "6"


@pytest.mark.integration
def test_a_version_withdrawn_and_redone_under_the_same_number_serves_its_new_weights(triton, good_and_bad):
    good, bad, sample = good_and_bad
    publisher = publisher_for(triton, promotion_margin=1.0)
    first, x = new_learner(seed=5), sample.x[:4]
    save_version(publisher.store, 1, good, sample)
    save_version(publisher.store, 2, first, sample)
    publisher.publish(1)
    publisher.publish(2)
    torch.testing.assert_close(served_answer(triton, publisher.model, x)[1], first.predict_proba(x), rtol=0, atol=1e-5)

    withdraw(publisher.store, 2)
    publisher.resync()
    assert served_answer(triton, publisher.model, x)[0] == "1"
    save_version(publisher.store, 2, bad, sample)
    assert publisher.publish(2).action == "promoted"
    for name in (publisher.model, f"{publisher.model}-v2"):
        version, answers = served_answer(triton, name, x)
        assert version == "2"
        torch.testing.assert_close(answers, bad.predict_proba(x), rtol=0, atol=1e-5)


@pytest.mark.integration
@pytest.mark.parametrize("check", CHECKS)
def test_triton_publisher_contract(triton, good_and_bad, check):
    def make(**serving) -> TritonPublisher:
        return publisher_for(triton, **serving)

    def served(publisher, x: torch.Tensor) -> torch.Tensor:
        return served_answer(triton, publisher.model, x)[1]

    (found,) = [c for c in yield_publisher_checks(Backend("triton", make, served), *good_and_bad) if c.name == check]
    found()


@pytest.mark.integration
def test_alma_serve_starts_a_triton_the_publisher_can_use_and_stops_it(tmp_path, good_and_bad, capsys):
    if not installed():
        pytest.skip(f"Triton's virtualenv is missing: no {triton_python()} (run scripts/setup_triton.sh)")
    good, _, sample = good_and_bad
    url = f"http://127.0.0.1:{free_port()}"
    settings = {
        "daemon.state_dir": tmp_path / "state",
        "daemon.checkpoint_dir": tmp_path / "ms",
        "serving.kind": "triton",
        "serving.inference_url": url,
        "serving.niceness": 0,
    }
    config = [arg for key, value in settings.items() for arg in ("--set", f"{key}={value}")]
    assert main(["serve", "--kind", "triton", *config]) == 0
    try:
        printed = capsys.readouterr().out
        assert "Triton started" in printed and f"{url}/v2/models/alma/infer" in printed
        token = tmp_path / "state" / "triton" / "repository_token"
        assert oct(token.stat().st_mode & 0o777) == "0o600"
        # The token is on Triton's command line, not in the log that records the command.
        assert token.read_text().strip() not in (tmp_path / "state" / "triton" / "triton.log").read_text()
        assert main(["serve", "--kind", "triton", *config]) == 1
        assert "Triton already runs from" in capsys.readouterr().err

        publisher = make_publisher(build_config({}, [f"{key}={value}" for key, value in settings.items()]))
        assert isinstance(publisher, TritonPublisher)
        save_version(publisher.store, 1, good, sample)
        assert publisher.publish(1).action == "promoted"
        version, answers = served_answer_at(url, sample.x[:4])
        assert version == "1"
        torch.testing.assert_close(answers, good.predict_proba(sample.x[:4]), rtol=0, atol=1e-5)
    finally:
        assert main(["serve", "--kind", "triton", *config, "--stop"]) == 0
    assert "Triton stopped" in capsys.readouterr().out
    with pytest.raises(OSError):
        http_request("GET", f"{url}/v2/health/live", timeout=2)


def served_answer_at(url: str, x: torch.Tensor) -> tuple[str, torch.Tensor]:
    codec = codec_for(MNIST_TASK)
    status, body = http_request(
        "POST",
        f"{url}/v2/models/alma/infer",
        json.dumps(codec.encode_oip(x)).encode(),
        {"Content-Type": "application/json"},
    )
    assert status == 200, body
    answer = json.loads(body)
    return answer["model_version"], codec.decode_oip(answer)


@pytest.mark.integration
def test_a_restarted_triton_serves_the_recorded_default_before_anything_is_asked(triton, good_and_bad):
    """Last in the module: it restarts the module's server (whose own model is this test's)."""
    good, bad, sample = good_and_bad
    publisher = publisher_for(triton, model=triton.model, keep_versions=1, promotion_margin=1.0)
    save_version(publisher.store, 1, bad, sample)
    save_version(publisher.store, 2, good, sample)
    publisher.publish(1)
    publisher.publish(2)
    triton.stop()
    triton.start()

    assert sorted(ours(triton.model, publisher.client.models())) == [triton.model, f"{triton.model}-v2"]
    version, answers = served_answer(triton, triton.model, sample.x[:4])
    assert version == "2"
    torch.testing.assert_close(answers, good.predict_proba(sample.x[:4]), rtol=0, atol=1e-5)
    publisher.resync()
    assert publisher.served_versions() == [2]
