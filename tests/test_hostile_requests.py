"""Hostile requests (issue 51): one battery per protocol, run against the codecs in process and against
each real server.

A case is a request an outside client may send to a served model (MNIST pixels, named features or a
language model's text) and the words it must be refused with: a datatype that is not the model's, a
float for an integer tensor, a bool or a string for a number, a negative or zero size, and the sizes,
depths and lengths meant to exhaust a server. In process (``test_the_*_codec_refuses``), the codec
alone must refuse it with one short line. Against a server (the ``integration`` tests), the client must get
the protocol's bad-request error with those words, and the server must answer a valid request right
after it. Where a server's own layer refuses a request before the codec sees it (a body over
TorchServe's size limit, JSON its parser cannot read), the case names that server and its answer.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import urllib.error
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import safetensors.torch
import torch

from alma_daemon.config import build_config
from alma_daemon.data.datasets import MNIST_TASK, TaskInfo
from alma_daemon.data.tensors import LabeledData
from alma_daemon.data.text import WordVocabulary, sequences
from alma_daemon.learners import Learner, build_learner
from alma_daemon.local_servers.processes import ServerNotInstalled
from alma_daemon.local_servers.triton import TritonServer
from alma_daemon.local_servers.triton_install import TritonInstall, triton_python
from serving.protocols.codecs import SAFETENSORS_CONTENT_TYPE, codec_for
from serving.protocols.requests import MAX_DEPTH, MAX_INSTANCES, MAX_TEXT_CHARS, RequestError
from serving.protocols.tensors import tensors_of
from serving.protocols.version_names import versioned_name
from serving.publishing import make_publisher
from serving.publishing.publisher import Publisher
from tests.helpers.configs import learner_settings
from tests.helpers.data import separable_data
from tests.helpers.servers import KServeServer, MLServerServer, http_request
from tests.helpers.serving import save_version
from tests.helpers.user_models import FEATURES, feature_data

MODEL = "alma"
JSON = "application/json"

# ------------------------------------------------------------------------------------- the models

TEXT = "the cat sat on the mat\nthe dog sat on the log\na cat and a dog\n" * 8
WORDS = WordVocabulary.from_text(TEXT)
TEXT_TASK = TaskInfo(
    "language_model", (8,), WORDS.vocab_size, extra={"vocab_size": WORDS.vocab_size, "tokenizer": WORDS.to_dict()}
)
FEATURE_NAMES = [f"f{i:02d}" for i in range(FEATURES.input_shape[0])]
FEATURE_TASK = dataclasses.replace(
    FEATURES.with_statistics(feature_data(200, seed=0).x),
    classes=("low", "mid", "high"),
    extra={"features": FEATURE_NAMES},
)
#: The served models, by the name a case targets: each one's task, and the checkpoint version it is
#: served as (``alma-v<N>`` over the Open Inference Protocol, ``/predictions/alma/<N>`` on TorchServe).
TASKS = {"pixels": MNIST_TASK, "features": FEATURE_TASK, "text": TEXT_TASK}
VERSIONS = {"pixels": 1, "features": 2, "text": 3}


TINY_LM = {"layers": 1, "d_model": 16, "heads": 2, "d_ff": 32, "experts": 2}


@functools.cache
def served_learner(model: str) -> Learner:
    """A small untrained learner of ``model``'s task (the same one each time): refusals do not depend on
    its weights."""
    name, overrides = ("switch-lm", TINY_LM) if model == "text" else ("sm", {})
    return build_learner(name, TASKS[model], learner_settings(name, {"width": 8, "members": 2}, overrides), 0)


def sample_for(model: str, n: int = 16) -> LabeledData:
    if model == "text":
        tokens = sequences(WORDS.encode(TEXT), TEXT_TASK.input_shape[0])
        # x and y are views of one tensor; safetensors refuses to save tensors sharing memory.
        return LabeledData(tokens.x[:n].clone(), tokens.y[:n].clone())
    return separable_data(MNIST_TASK, n, seed=3) if model == "pixels" else feature_data(n, seed=3)


# ------------------------------------------------------------------------------------ the battery


#: The status of an answer that never came: the server closed the connection while the body was sent.
CLOSED = 0


@dataclass(frozen=True)
class Refused:
    """How a server refuses a request: with one of ``statuses``, its message holding ``words``."""

    statuses: tuple[int, ...]
    words: str


@dataclass(frozen=True)
class Hostile:
    """One hostile request: ``body`` (a JSON document, or bytes sent as they are) for ``model``.

    ``refusal``: the words of the codec's refusal (None where no codec sees the request, the server's
    JSON parser refusing it). ``servers``: a server (``kserve``, ``mlserver``, ``torchserve``) that
    refuses the request with its own layer, before the codec, and how (:class:`Refused`).
    """

    name: str
    model: str
    body: Any
    refusal: str | None
    servers: dict[str, Refused] = field(default_factory=dict)
    content_type: str = JSON

    def encoded(self) -> bytes:
        return self.body if isinstance(self.body, bytes) else json.dumps(self.body).encode()


def tensor(name: str, datatype: str, shape: list[int], data: list) -> dict:
    return {"name": name, "datatype": datatype, "shape": shape, "data": data}


def pixels(datatype: str = "UINT8", shape: list[int] | None = None, data: list | None = None) -> dict:
    """An OIP request for one MNIST example (zeros), changed where a case says."""
    return {"inputs": [tensor("x", datatype, shape or [1, 28, 28], [0] * 784 if data is None else data)]}


def features(name: str = "f00", **changes: Any) -> dict:
    """An OIP request for two examples of named features, one FP32 tensor each; ``name``'s tensor changed."""
    tensors = [tensor(f, "FP32", [2], [0.5, -1.0]) for f in FEATURE_NAMES]
    return {"inputs": [{**t, **changes} if t["name"] == name else t for t in tensors]}


def text(datatype: str = "BYTES", data: list | None = None, **parameters: Any) -> dict:
    body: dict[str, Any] = {"inputs": [tensor("text", datatype, [1], data or ["the cat sat on"])]}
    return {**body, "parameters": parameters} if parameters else body


def deeply_nested(depth: int, prefix: str, suffix: str) -> bytes:
    """A JSON body whose value between ``prefix`` and ``suffix`` is ``depth`` nested empty lists."""
    return (prefix + "[" * depth + "]" * depth + suffix).encode()


def named(**changes: Any) -> dict:
    """One example of named features (each 0.5) as an event carries it, fields changed where a case says."""
    return {**{f: 0.5 for f in FEATURE_NAMES}, **changes}


def nan_example(prefix: str, suffix: str) -> bytes:
    """A body holding one 28 x 28 example of the NaN literal, which Python's JSON parser reads and JSON
    does not have."""
    row = "[" + ", ".join(["NaN"] * 28) + "]"
    return (prefix + "[" + ", ".join([row] * 28) + "]" + suffix).encode()


#: 100 MiB of text, made once: both batteries send it.
HUGE = "x" * (100 << 20)
#: TorchServe's own answer to a body over its max_request_size (6.5 MB by default): a 413, or, as it
#: closes the connection at once, a reset while the client is still sending.
TORCHSERVE_TOO_LARGE = Refused((413, CLOSED), "")


def oip_battery() -> Iterator[Hostile]:
    """The Open Inference Protocol's hostile requests (KServe's model server, MLServer)."""
    # Each size must be at least 1: numpy reads -1 as "whatever fits" and answered a prediction.
    yield Hostile("negative batch", "pixels", pixels(shape=[-1, 28, 28]), "tensor 'x': shape [-1, 28, 28] lists -1")
    yield Hostile("negative size", "pixels", pixels(shape=[1, 28, -28]), "tensor 'x': shape [1, 28, -28] lists -28")
    yield Hostile("zero batch", "pixels", pixels(shape=[0, 28, 28], data=[]), "shape [0, 28, 28] lists 0")
    yield Hostile("zero size", "pixels", pixels(shape=[1, 0, 28], data=[]), "shape [1, 0, 28] lists 0")
    yield Hostile("negative feature size", "features", features(shape=[-2]), "tensor 'f00': shape [-2] lists -2")
    # A datatype that is not the model's: BOOL data for a UINT8 model answered a prediction.
    yield Hostile(
        "bools for pixels", "pixels", pixels("BOOL", data=[False] * 784), "examples must be numbers, not BOOL"
    )
    yield Hostile("text for pixels", "pixels", pixels("BYTES", data=["0"] * 784), "examples must be numbers, not BYTES")
    yield Hostile("text for a feature", "features", features(datatype="BYTES", data=["1", "2"]), "feature 'f00' must")
    yield Hostile("bools for a feature", "features", features("f03", datatype="BOOL", data=[True, False]), "'f03' must")
    yield Hostile(
        "numbers for text", "text", text("FP32", [1.0]), '"text" must hold strings (datatype BYTES), not FP32'
    )
    yield Hostile(
        "unknown datatype",
        "pixels",
        pixels("FP99"),
        "tensor 'x': unknown datatype 'FP99'",
        {"mlserver": Refused((422,), "Input should be 'BOOL', 'UINT8'")},  # its request model lists the datatypes
    )
    # Data that is not of its own datatype: numpy made 1.5 an INT64 1 and "1" an FP32 1.0.
    yield Hostile("fraction for UINT8", "pixels", pixels(data=[1.5] * 784), "UINT8 data must be integers, not a float")
    yield Hostile("fraction for INT64", "pixels", pixels("INT64", data=[1.5] * 784), "INT64 data must be integers")
    yield Hostile("bools as FP32", "pixels", pixels("FP32", data=[True] * 784), "FP32 data must be numbers, not a bool")
    yield Hostile("string as FP32", "pixels", pixels("FP32", data=["1"] * 784), 'numbers, not a string ("1")')
    yield Hostile("null as FP32", "pixels", pixels("FP32", data=[None] * 784), "FP32 data must be numbers, not null")
    yield Hostile("string as a feature", "features", features(data=["1", "2"]), "tensor 'f00': FP32 data must be")
    yield Hostile("fraction for INT64 feature", "features", features(datatype="INT64", data=[1, 1.5]), "'f00': INT64")
    yield Hostile("number as text", "text", text(data=[3]), "tensor 'text': BYTES data must be strings, not an integer")
    yield Hostile("bool as top_k", "text", text(top_k=True), "top_k must be an integer in [1, 1000]; got a bool")
    yield Hostile("fraction as top_k", "text", text(top_k=2.5), "top_k must be an integer in [1, 1000]; got a float")
    yield Hostile("uint8 above 255", "pixels", pixels(data=[300] * 784), "out of bounds for uint8")
    # What was refused already, and stays refused.
    yield Hostile(
        "2^80 examples",
        "pixels",
        pixels(shape=[2**80, 28, 28]),
        "784 values for shape [1208925819614629",
        {"mlserver": Refused((422,), "Unable to parse input string as an integer, exceeded maximum size")},
    )
    yield Hostile("10^9 examples", "pixels", pixels(shape=[10**9, 28, 28]), "784 values for shape [1000000000, 28, 28]")
    yield Hostile(
        "NaN",
        "pixels",
        nan_example('{"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 28, 28], "data": [', "]}]}"),
        "examples contain NaN or infinite values",
        {"mlserver": Refused((422,), "JSON decode error")},  # its parser keeps to JSON, which has no NaN
    )
    yield Hostile("beyond FP32", "pixels", pixels("FP32", data=[1e39] * 784), "examples contain NaN or infinite values")
    yield Hostile("no inputs", "pixels", {"inputs": []}, 'expected "inputs": a list of tensors')
    yield Hostile("flat 784-vector", "pixels", pixels(shape=[784]), "each example must have shape [28, 28]")
    yield Hostile("two tensors named x", "pixels", {"inputs": pixels()["inputs"] * 2}, "tensor 'x' is given twice")
    many = 100_000
    yield Hostile(
        "100,000-example batch",
        "features",
        {"inputs": [tensor(f, "FP32", [many], [0.5] * many) for f in FEATURE_NAMES]},
        f"at most {MAX_INSTANCES} examples",
    )
    yield Hostile(
        "data nested too deep",
        "pixels",
        pixels(shape=[1], data=json.loads("[" * 200 + "]" * 200)),
        f"are nested more than {MAX_DEPTH} levels deep",
    )
    yield Hostile(
        "100,000 nested brackets",
        "pixels",
        deeply_nested(100_000, '{"inputs": [{"name": "x", "datatype": "FP32", "shape": [1], "data": ', "}]}"),
        None,
        {
            "kserve": Refused((400,), "There was an error parsing the body"),
            "mlserver": Refused((422,), "JSON decode error"),
        },
    )
    yield Hostile("100 MiB string", "pixels", pixels("FP32", [1], [HUGE]), "FP32 data must be numbers, not a string")
    yield Hostile("text over the cap", "text", text(data=["a" * (MAX_TEXT_CHARS + 1)]), "at most 1048576 characters")


def torchserve_battery() -> Iterator[Hostile]:
    """TorchServe's hostile requests (the handler's JSON and safetensors bodies, serving/protocols/codecs.py)."""
    yield Hostile(
        "bools for pixels", "pixels", {"instances": [[[True] * 28] * 28]}, "instances must be nested lists of numbers"
    )
    yield Hostile("strings for pixels", "pixels", {"instances": [[["1"] * 28] * 28]}, 'numbers, not a string ("1")')
    yield Hostile("nulls for pixels", "pixels", {"instances": [[[None] * 28] * 28]}, "numbers, not null")
    yield Hostile("ragged example", "pixels", {"instances": [[[0] * 28] * 27 + [[0] * 27]]}, "lists of one shape")
    yield Hostile("empty example", "pixels", {"instances": [[]]}, "got a batch of shape [1, 0]")
    yield Hostile("flat 784-vector", "pixels", {"instances": [[0] * 784]}, "each example must have shape [28, 28]")
    yield Hostile("no instances", "pixels", {"instances": []}, "with at least one example")
    yield Hostile("100,000-example batch", "pixels", {"instances": [[0]] * 100_000}, "at most 4096 instances")
    yield Hostile(
        "NaN",
        "pixels",
        nan_example('{"instances": [', "]}"),
        "examples contain NaN or infinite values",
    )
    yield Hostile("beyond FP32", "pixels", {"instances": [[[1e39] * 28] * 28]}, "NaN or infinite values")
    yield Hostile("beyond FP64", "pixels", {"instances": [[[10**400] * 28] * 28]}, "a number beyond the float range")
    yield Hostile(
        "100,000 nested brackets", "pixels", deeply_nested(100_000, '{"instances": ', "}"), "nested too deeply"
    )
    yield Hostile(
        "nested too deep",
        "pixels",
        {"instances": json.loads("[" * 200 + "]" * 200)},
        f"instances are nested more than {MAX_DEPTH} levels deep",
    )
    yield Hostile(
        "100 MiB string",
        "pixels",
        {"instances": [HUGE]},
        "instances must be nested lists of numbers, not a string",
        {"torchserve": TORCHSERVE_TOO_LARGE},
    )
    yield Hostile(
        "bools as safetensors",
        "pixels",
        safetensors.torch.save({"x": torch.zeros(1, 28, 28, dtype=torch.bool)}),
        "tensor 'x' must be uint8 or float32; got torch.bool",
        content_type=SAFETENSORS_CONTENT_TYPE,
    )
    yield Hostile(
        "int64 as safetensors",
        "pixels",
        safetensors.torch.save({"x": torch.zeros(1, 28, 28, dtype=torch.int64)}),
        "tensor 'x' must be uint8 or float32; got torch.int64",
        content_type=SAFETENSORS_CONTENT_TYPE,
    )
    yield Hostile(
        "zero batch as safetensors",
        "pixels",
        safetensors.torch.save({"x": torch.zeros(0, 28, 28, dtype=torch.uint8)}),
        "a request holds 1 to 4096 examples; got 0",
        content_type=SAFETENSORS_CONTENT_TYPE,
    )
    yield Hostile("a bool for a feature", "features", named(f00=True), "field 'f00' is true, not a number")
    yield Hostile("a string for a feature", "features", named(f02="1"), "field 'f02' is \"1\", not a number")
    yield Hostile("a null for a feature", "features", named(f05=None), "field 'f05' is null, not a number")
    yield Hostile(
        "100,000 examples of features",
        "features",
        {f: [0.5] * 100_000 for f in FEATURE_NAMES},
        f"at most {MAX_INSTANCES} examples",
    )
    yield Hostile("a number for text", "text", {"instances": [3]}, "each instance must be a string of text, not an")
    yield Hostile("bool as top_k", "text", {"instances": ["the cat"], "top_k": True}, "got a bool (true)")
    yield Hostile("fraction as top_k", "text", {"instances": ["the cat"], "top_k": 2.5}, "got a float (2.5)")
    yield Hostile("string as top_k", "text", {"instances": ["the cat"], "top_k": "3"}, 'got a string ("3")')
    yield Hostile(
        "text over the cap", "text", {"instances": ["a" * (MAX_TEXT_CHARS + 1)]}, "at most 1048576 characters"
    )


def cases(battery: Callable[[], Iterator[Hostile]]) -> list[Any]:
    return [pytest.param(case, id=case.name) for case in battery()]


# -------------------------------------------------------------------------------------- in process


def oip_answer(model: str, body: Any) -> list:
    """What a KServe or MLServer server answers to ``body`` (bytes: parsed as JSON, as they do) for ``model``."""
    document = json.loads(body) if isinstance(body, bytes) else body
    learner = served_learner(model)
    inputs = tensors_of(document.get("inputs"), "inputs")
    return codec_for(learner.task).answer_oip(learner, inputs, document.get("parameters") or {})


def torchserve_answer(model: str, body: Any, content_type: str = JSON) -> dict:
    """What the TorchServe handler answers to ``body`` for ``model``: TorchServe hands over a JSON body
    parsed, or as it came where its parser failed; a safetensors body as it came."""
    if isinstance(body, bytes) and content_type == JSON:
        try:
            body = json.loads(body)
        except (ValueError, RecursionError):
            pass
    learner = served_learner(model)
    return codec_for(learner.task).answer_json(learner, body)


def valid_oip(model: str) -> dict:
    return codec_for(TASKS[model]).encode_oip(sample_for(model, 2).x)


def valid_torchserve(model: str) -> dict:
    return codec_for(TASKS[model]).encode_json(sample_for(model, 2).x)


def one_line(error: BaseException) -> str:
    message = str(error)
    assert "\n" not in message and len(message) <= 300, f"not one short line: {message[:400]!r}"
    return message


@pytest.mark.parametrize("case", cases(oip_battery))
def test_the_oip_codec_refuses(case: Hostile) -> None:
    if case.refusal is None:  # the server's JSON parser refuses it: no codec sees it
        with pytest.raises((ValueError, RecursionError)):
            json.loads(case.encoded())
        return
    with pytest.raises(RequestError) as refused:
        oip_answer(case.model, case.body)
    assert case.refusal in one_line(refused.value)


@pytest.mark.parametrize("case", cases(torchserve_battery))
def test_the_torchserve_codec_refuses(case: Hostile) -> None:
    with pytest.raises(RequestError) as refused:
        torchserve_answer(case.model, case.body, case.content_type)
    assert case.refusal is not None and case.refusal in one_line(refused.value)


@pytest.mark.parametrize("model", list(TASKS))
def test_the_valid_requests_the_battery_checks_between_cases_are_answered(model: str) -> None:
    assert oip_answer(model, valid_oip(model))
    assert torchserve_answer(model, valid_torchserve(model))["predictions"]


# ------------------------------------------------------------------------------ against each server


def publish_the_models(publisher: Publisher) -> None:
    """Save the pixels, features and text models as versions 1 to 3; make 1 the default and load the
    other two beside it (each is probed with its own requests as it is loaded)."""
    for model, version in VERSIONS.items():
        save_version(publisher.store, version, served_learner(model), sample_for(model))
    assert publisher.publish(VERSIONS["pixels"]).action == "promoted"
    for model in ("features", "text"):
        publisher.stage(publisher.load_candidate(VERSIONS[model]))


#: Asks a server about one model: (model, body, content type) -> (status, answer's text).
Ask = Callable[[str, bytes, str], tuple[int, str]]


def asking(url_of: Callable[[str], str]) -> Ask:
    """POSTs to the URL ``url_of`` gives for a model; a connection the server closed while the body was
    sent is answered :data:`CLOSED`."""

    def ask(model: str, body: bytes, content_type: str) -> tuple[int, str]:
        try:
            status, answer = http_request("POST", url_of(model), body, {"Content-Type": content_type}, timeout=120)
        except (ConnectionError, urllib.error.URLError) as err:
            if not isinstance(getattr(err, "reason", err), ConnectionError):
                raise
            return CLOSED, f"connection closed while sending: {err}"
        return status, answer.decode(errors="replace")

    return ask


def said(answer: str) -> str:
    """The message of a server's error answer: its JSON "error" (KServe, MLServer, the TorchServe handler)
    or "message" (TorchServe itself), else the answer as it came."""
    try:
        document = json.loads(answer)
    except ValueError:
        return answer
    if isinstance(document, dict):
        return str(document.get("error") or document.get("message") or answer)
    return answer


def run_battery(server: str, ask: Ask, battery: Iterator[Hostile], valid: Callable[[str], dict]) -> list[str]:
    """Each hostile request, then a valid one for the same model; what went otherwise than the case says."""
    failures = []
    for case in battery:
        status, answer = ask(case.model, case.encoded(), case.content_type)
        refused = case.servers.get(server) or Refused((400,), case.refusal or "(no codec sees it)")
        if status not in refused.statuses or refused.words not in said(answer):
            failures.append(f"{case.name}: {status} {answer[:300]}")
        status, answer = ask(case.model, json.dumps(valid(case.model)).encode(), JSON)
        if status != 200:
            failures.append(f"{case.name}, then a valid request: {status} {answer[:300]}")
    return failures


def oip_publisher(server: KServeServer | MLServerServer | TritonServer, store_root: Path) -> Publisher:
    """A publisher to ``server`` (its URL and, where it has one, its repository token) over ``store_root``."""
    config = {
        "daemon": {"checkpoint_dir": str(store_root)},
        "serving": {"kind": "kserve", "model_name": MODEL, **server.publisher_settings()},
    }
    publisher = make_publisher(build_config(config))
    assert publisher is not None
    return publisher


def oip_asking(url: str) -> Ask:
    return asking(lambda model: f"{url}/v2/models/{versioned_name(MODEL, VERSIONS[model])}/infer")


@pytest.mark.integration
def test_kserve_refuses_each_hostile_request_and_keeps_serving(kserve_server, tmp_path):
    server = kserve_server(tmp_path / "model_store", MODEL)
    publish_the_models(oip_publisher(server, tmp_path / "model_store"))
    failures = run_battery("kserve", oip_asking(server.inference_url), oip_battery(), valid_oip)
    assert not failures, "\n".join(failures)


@pytest.mark.integration
def test_mlserver_refuses_each_hostile_request_and_keeps_serving(mlserver_server, tmp_path):
    server = mlserver_server(tmp_path / "model_store", MODEL)
    publish_the_models(oip_publisher(server, tmp_path / "model_store"))
    failures = run_battery("mlserver", oip_asking(server.inference_url), oip_battery(), valid_oip)
    assert not failures, "\n".join(failures)


#: Triton checks a request against the model's config and parses its JSON before the model sees it, so
#: its own layer answers most cases: 400 naming the datatype or shape, 500 where its parser fails
#: (Triton's words, not the input's name), and 200 for UINT8 data above 255, which it wraps (300 is
#: read as 44). Each is a limit of tritonserver 2.51 that docs/serving.md names; the battery keeps them
#: in view, so that a Triton that changes shows here.
TRITON_ANSWERS = {
    **dict.fromkeys(
        ["negative batch", "negative size", "negative feature size", "2^80 examples"],
        Refused((500,), "Unable to parse 'shape'"),
    ),
    "zero size": Refused((400,), "unexpected shape for input 'x'"),
    "flat 784-vector": Refused((400,), "unexpected shape for input 'x'"),
    **dict.fromkeys(
        [
            "bools for pixels",
            "text for pixels",
            "text for a feature",
            "bools for a feature",
            "numbers for text",
            "NaN",
            "beyond FP32",
        ],
        Refused((400,), "data-type is"),
    ),
    "unknown datatype": Refused((400,), "invalid datatype for input x"),
    **dict.fromkeys(
        [
            "fraction for UINT8",
            "fraction for INT64",
            "bools as FP32",
            "string as FP32",
            "null as FP32",
            "string as a feature",
            "fraction for INT64 feature",
            "data nested too deep",
        ],
        Refused((500,), "Unable to parse 'data'"),
    ),
    "number as text": Refused((500,), "Unable to parse JSON bytes array"),
    "uint8 above 255": Refused((200,), '"model_version":"1"'),
    "two tensors named x": Refused((400,), "input 'x' already exists in request"),
    "100 MiB string": Refused((500,), "Unable to parse 'data'"),
    # These reach the model, whose backend reads Triton's tensors, not the protocol's JSON.
    "zero batch": Refused((400,), "a request holds 1 to 4096 examples; got 0"),
    "no inputs": Refused((400,), "expected one input tensor of examples"),
}
#: The cases that take tritonserver 2.51 down (it aborts before any model sees them): not sent.
TRITON_TAKES_DOWN = {"10^9 examples", "100,000 nested brackets"}


def triton_battery() -> Iterator[Hostile]:
    """:func:`oip_battery` as Triton answers it (:data:`TRITON_ANSWERS`), less what takes it down."""
    for case in oip_battery():
        if case.name in TRITON_TAKES_DOWN:
            continue
        answer = TRITON_ANSWERS.get(case.name)
        yield case if answer is None else dataclasses.replace(case, servers={**case.servers, "triton": answer})


@pytest.fixture
def triton_server(tmp_path) -> Iterator[TritonServer]:
    """A Triton over ``tmp_path``'s model store, stopped at the end (skipped without Triton's virtualenv)."""
    try:
        TritonInstall.find(triton_python())
    except ServerNotInstalled as missing:
        # Triton lives in a virtualenv of its own (its wheel pins numpy < 2), which scripts/setup.sh builds
        # but may fail to on a Python without a shared libpython (it then warns); every other server's
        # battery still runs. In CI the virtualenv is built, so this test runs there.
        pytest.skip(f"Triton's virtualenv is missing (scripts/setup_triton.sh): {missing}")
    server = TritonServer(tmp_path / "server", tmp_path / "model_store", MODEL)
    server.start()
    try:
        yield server
    finally:
        server.stop()


@pytest.mark.integration
def test_triton_refuses_each_hostile_request_and_keeps_serving(triton_server, tmp_path):
    publish_the_models(oip_publisher(triton_server, tmp_path / "model_store"))
    failures = run_battery("triton", oip_asking(triton_server.inference_url), triton_battery(), valid_oip)
    assert not failures, "\n".join(failures)


@pytest.mark.integration
def test_torchserve_refuses_each_hostile_request_and_keeps_serving(torchserve_server, tmp_path):
    server = torchserve_server()
    config = {
        "daemon": {"checkpoint_dir": str(tmp_path / "model_store")},
        "serving": {
            "kind": "torchserve",
            "model_name": MODEL,
            "management_url": server.management_url,
            "inference_url": server.inference_url,
        },
    }
    publisher = make_publisher(build_config(config))
    assert publisher is not None
    publish_the_models(publisher)
    ask = asking(lambda model: f"{server.inference_url}/predictions/{MODEL}/{VERSIONS[model]}")
    failures = run_battery("torchserve", ask, torchserve_battery(), valid_torchserve)
    assert not failures, "\n".join(failures)
