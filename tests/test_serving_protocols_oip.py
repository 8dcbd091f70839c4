"""The Open Inference Protocol's tensors (serving/protocols/tensors.py, the codecs' ``*_oip`` methods in
serving/protocols/codecs.py) and version names (serving/protocols/version_names.py), without a server:
each task kind's request and answer round trip to the learner's own answers, and a bad request is
refused with one clear line, in the same words as TorchServe's JSON where the two check alike."""

from __future__ import annotations

import dataclasses
import json
import math

import numpy as np
import pytest
import torch

from alma_daemon.data.datasets import MNIST_TASK, TaskInfo
from alma_daemon.data.text import WordVocabulary, sequences
from alma_daemon.learners import Learner, build_learner
from serving.protocols.codecs import codec_for
from serving.protocols.requests import RequestError
from serving.protocols.tensors import OipTensor, request_body, tensors_of
from serving.protocols.version_names import DEFAULT_FILE, read_default, version_of, versioned_name, write_default
from tests.helpers.configs import learner_settings
from tests.helpers.contract import FEATURES as REGRESSION_TASK
from tests.helpers.contract import linear_data
from tests.helpers.data import separable_data
from tests.helpers.serving import new_learner
from tests.helpers.user_models import FEATURES, feature_data

TEXT = "the cat sat on the mat\nthe dog sat on the log\na cat and a dog\n" * 8
WORDS = WordVocabulary.from_text(TEXT)
LM_TASK = TaskInfo(
    "language_model", (8,), WORDS.vocab_size, extra={"vocab_size": WORDS.vocab_size, "tokenizer": WORDS.to_dict()}
)
TINY_LM = {"layers": 1, "d_model": 16, "heads": 2, "d_ff": 32, "experts": 2}

FEATURE_NAMES = [f"f{i:02d}" for i in range(FEATURES.input_shape[0])]
#: A team's task: standardized features asked by name, classes answered by name (as in the TorchServe tests).
FEATURE_TASK = dataclasses.replace(
    FEATURES.with_statistics(feature_data(200, seed=0).x),
    classes=("low", "mid", "high"),
    extra={"features": FEATURE_NAMES},
)


def over_the_wire(document: dict) -> dict:
    """``document`` as the other side reads it: JSON text and back."""
    return json.loads(json.dumps(document))


def answer_json(learner: Learner, request: dict) -> dict:
    """The response a server sends to ``request``, through JSON both ways."""
    codec = codec_for(learner.task)
    request = over_the_wire(request)
    outputs = codec.answer_oip(learner, tensors_of(request["inputs"], "inputs"), request.get("parameters") or {})
    return over_the_wire({"model_name": "alma", "outputs": [t.to_json() for t in outputs]})


def outputs_by_name(response: dict) -> dict[str, dict]:
    return {output["name"]: output for output in response["outputs"]}


def tensor(name: str, datatype: str, shape: list[int], data: list) -> dict:
    return {"name": name, "datatype": datatype, "shape": shape, "data": data}


def by_feature(x: torch.Tensor, names: list[str] = FEATURE_NAMES) -> dict:
    """A request with one FP32 tensor of shape [N] per named feature, as a team's client sends them."""
    return {"inputs": [tensor(name, "FP32", [len(x)], x[:, i].tolist()) for i, name in enumerate(names)]}


def refusal(learner: Learner, request: dict) -> str:
    """The RequestError's line for ``request``; fails the test where it is answered or fails otherwise."""
    with pytest.raises(RequestError) as refused:
        answer_json(learner, request)
    return str(refused.value)


# ------------------------------------------------------------------------------------ round trips


def test_a_classifier_answers_its_probabilities_and_no_class_names_where_the_task_names_none():
    learner, x = new_learner(), separable_data(MNIST_TASK, 6, seed=3).x
    codec = codec_for(MNIST_TASK)
    request = codec.encode_oip(x)
    (sent,) = request["inputs"]
    assert (sent["datatype"], sent["shape"]) == ("UINT8", [6, 28, 28])

    response = answer_json(learner, request)
    outputs = outputs_by_name(response)
    assert set(outputs) == {"probabilities"}
    assert (outputs["probabilities"]["datatype"], outputs["probabilities"]["shape"]) == ("FP32", [6, 10])
    expected = learner.predict_proba(x)
    torch.testing.assert_close(codec.decode_oip(response), expected, rtol=0, atol=1e-6)
    torch.testing.assert_close(codec.answer_oip_in_process(learner, request), codec.decode_oip(response))


def test_uint8_and_fp32_examples_of_the_same_pixels_get_the_same_answer():
    learner, x = new_learner(), separable_data(MNIST_TASK, 4, seed=5).x
    codec = codec_for(MNIST_TASK)
    as_uint8 = {"inputs": [tensor("x", "UINT8", [4, 28, 28], x.reshape(-1).tolist())]}
    as_fp32 = {"inputs": [tensor("pixels", "FP32", [4, 28, 28], x.float().reshape(-1).tolist())]}
    torch.testing.assert_close(codec.answer_oip_in_process(learner, as_uint8), learner.predict_proba(x), rtol=0, atol=0)
    torch.testing.assert_close(
        codec.answer_oip_in_process(learner, as_fp32), learner.predict_proba(x.float()), rtol=0, atol=1e-6
    )
    torch.testing.assert_close(
        codec.answer_oip_in_process(learner, as_uint8), codec.answer_oip_in_process(learner, as_fp32), rtol=0, atol=1e-6
    )


def test_named_features_one_tensor_each_in_any_order_answer_with_class_names():
    learner = build_learner("sm", FEATURE_TASK, learner_settings("sm", {"width": 8}), 0)
    x = feature_data(5, seed=3).x
    codec = codec_for(FEATURE_TASK)
    shuffled = list(reversed(range(len(FEATURE_NAMES))))
    request = {"inputs": [by_feature(x)["inputs"][i] for i in shuffled]}

    response = answer_json(learner, request)
    outputs = outputs_by_name(response)
    assert set(outputs) == {"probabilities", "class"}
    assert (outputs["class"]["datatype"], outputs["class"]["shape"]) == ("BYTES", [5])
    expected = learner.predict_proba(x)
    assert outputs["class"]["data"] == [FEATURE_TASK.classes[i] for i in expected.argmax(1).tolist()]
    torch.testing.assert_close(codec.decode_oip(response), expected, rtol=0, atol=1e-6)
    torch.testing.assert_close(codec.answer_oip_in_process(learner, request), codec.decode_oip(response))
    # The examples as one tensor are still asked and answered alike.
    torch.testing.assert_close(codec.answer_oip_in_process(learner, codec.encode_oip(x)), expected, rtol=0, atol=1e-6)


def test_a_binary_versions_threshold_decides_the_class_and_is_answered_beside_it():
    task = dataclasses.replace(FEATURE_TASK, num_classes=2, classes=("ok", "fraud"))
    learner = build_learner("sm", task, learner_settings("sm", {"width": 8}), 0)
    x = feature_data(6, seed=3).x
    low = float(learner.predict_proba(x)[:, 1].min())
    learner.task = dataclasses.replace(task, decision="threshold", decision_target=low, threshold=low)
    outputs = outputs_by_name(answer_json(learner, by_feature(x)))
    assert outputs["class"]["data"] == ["fraud"] * 6  # every probability reaches the lowest one
    assert outputs["threshold"]["data"] == pytest.approx([low])
    signature = {o["name"]: o for o in codec_for(learner.task).oip_signature()[1]}
    assert signature["threshold"] == {"name": "threshold", "datatype": "FP32", "shape": [1]}


def test_a_regression_answers_one_prediction_per_example():
    sample = linear_data(50, 1)
    learner = build_learner("sm", REGRESSION_TASK, learner_settings("sm", {"width": 8}), 0)
    learner.take_statistics(sample)
    x = sample.x[:7]
    codec = codec_for(learner.task)
    request = codec.encode_oip(x)

    response = answer_json(learner, request)
    (output,) = response["outputs"]
    assert (output["name"], output["datatype"], output["shape"]) == ("predictions", "FP32", [7])
    torch.testing.assert_close(codec.decode_oip(response), learner.predict_outputs(x), rtol=0, atol=1e-5)
    torch.testing.assert_close(codec.answer_oip_in_process(learner, request), codec.decode_oip(response))


def lm_learner() -> Learner:
    return build_learner("switch-lm", LM_TASK, learner_settings("switch-lm", {}, TINY_LM), 0)


def test_a_language_model_answers_the_top_k_next_tokens_of_each_text():
    learner, codec = lm_learner(), codec_for(LM_TASK)
    x = sequences(WORDS.encode(TEXT), 8).x[:3]
    request = codec.encode_oip(x)
    (sent,) = request["inputs"]
    assert (sent["name"], sent["datatype"], sent["shape"]) == ("text", "BYTES", [3])

    response = answer_json(learner, {**request, "parameters": {"top_k": 4}})
    outputs = outputs_by_name(response)
    assert {name: (o["datatype"], o["shape"]) for name, o in outputs.items()} == {
        "tokens": ("INT64", [3, 4]),
        "probabilities": ("FP32", [3, 4]),
        "texts": ("BYTES", [3, 4]),
    }
    distribution = learner.predict_proba(x)[:, -1]
    best, ids = distribution.topk(4)
    assert np.array(outputs["tokens"]["data"]).reshape(3, 4).tolist() == ids.tolist()
    assert np.array(outputs["texts"]["data"]).reshape(3, 4).tolist() == [
        [WORDS.decode([i]) for i in row] for row in ids.tolist()
    ]
    dense = torch.zeros(3, LM_TASK.num_classes).scatter_(1, ids, best)
    torch.testing.assert_close(codec.decode_oip(response), dense, rtol=0, atol=1e-6)

    # Without the parameter, the default top 10.
    response = answer_json(learner, request)
    assert outputs_by_name(response)["tokens"]["shape"] == [3, 10]
    torch.testing.assert_close(codec.answer_oip_in_process(learner, request), codec.decode_oip(response))


# ---------------------------------------------------------------------------------- bad requests


def mnist_request(**changes) -> dict:
    entry = {**tensor("x", "FP32", [1, 28, 28], [3.0] * 784), **changes}
    return {"inputs": [entry]}


@pytest.mark.parametrize(
    "request_,words",
    [
        pytest.param(
            mnist_request(shape=[1, 784], data=[3.0] * 784), "each example must have shape [28, 28]", id="shape"
        ),
        pytest.param(
            {"inputs": [tensor("x", "FP32", [1, 28, 28], [1.0] * 784), tensor("y", "FP32", [1, 28, 28], [1.0] * 784)]},
            "expected one input tensor of examples, shape [N, 28, 28]; got 2",
            id="two-inputs-without-features",
        ),
        pytest.param(
            mnist_request(datatype="BYTES", data=["3"] * 784),
            "tensor 'x': examples must be numbers, not BYTES",
            id="bytes",
        ),
        pytest.param(mnist_request(data=[300.0] * 784), "values must be raw units in [0, 255]", id="above-255"),
        pytest.param(mnist_request(data=[-0.5] * 784), "values must be raw units in [0, 255]", id="normalized"),
        pytest.param(mnist_request(data=[math.nan] * 784), "examples contain NaN or infinite values", id="nan"),
        pytest.param(mnist_request(datatype="FP99"), "tensor 'x': unknown datatype 'FP99'", id="unknown-datatype"),
        pytest.param(
            mnist_request(shape=[2, 28, 28]),
            "tensor 'x': data does not fit its shape and datatype: 784 values for shape [2, 28, 28]",
            id="short",
        ),
        pytest.param(
            mnist_request(data=["a"] * 784), "tensor 'x': FP32 data must be numbers, not a string", id="text-as-fp32"
        ),
        pytest.param(
            mnist_request(datatype="UINT8", data=[300] * 784),
            "tensor 'x': data does not fit its shape and datatype: Python integer 300 out of bounds for uint8",
            id="uint8-300",
        ),
        pytest.param(
            mnist_request(shape=[0, 28, 28], data=[]),
            "tensor 'x': shape [0, 28, 28] lists 0; each size must be an integer of at least 1",
            id="empty",
        ),
        pytest.param(mnist_request(shape=[True, 28, 28]), "shape [True, 28, 28] lists True", id="bool-size"),
        pytest.param(mnist_request(shape=[1, "28", 28]), "shape [1, '28', 28] lists '28'", id="text-size"),
        pytest.param(mnist_request(shape=[1] * 17 + [784]), "shape must be a list of at most 16 sizes", id="rank"),
        pytest.param(mnist_request(shape="1x28x28"), "tensor 'x': shape must be a list", id="shape-string"),
        pytest.param(
            mnist_request(data="0" * 784), "tensor 'x': data must be a list of values, not a string", id="data"
        ),
        pytest.param(
            mnist_request(data=[[3.0] * 784]), "data is nested as [1, 784], neither flat nor as its shape", id="nested"
        ),
        pytest.param(
            mnist_request(data=[[3.0] * 392, [3.0] * 391 + [[3.0]]]), "lists beside values at depth 2", id="ragged"
        ),
        pytest.param(
            {"inputs": [{**mnist_request()["inputs"][0], "name": 7}]}, '"name" that is a non-empty string', id="name"
        ),
        pytest.param({"inputs": []}, 'expected "inputs": a list of tensors', id="no-inputs"),
        pytest.param({"inputs": [{"name": "x", "data": [1]}]}, '"name", "shape", "datatype" and "data"', id="keys"),
    ],
)
def test_a_bad_request_for_examples_is_refused_with_one_line_naming_its_fault(request_, words):
    message = refusal(new_learner(), request_)
    assert words in message and "\n" not in message


def feature_learner() -> Learner:
    return build_learner("sm", FEATURE_TASK, learner_settings("sm", {"width": 8}), 0)


def test_bad_named_features_are_refused_with_the_words_of_the_wire():
    learner, x = feature_learner(), feature_data(3, seed=3).x
    good = by_feature(x)["inputs"]

    def without(name: str) -> list[dict]:
        return [t for t in good if t["name"] != name]

    assert "fields missing ['f01'], unexpected []" in refusal(learner, {"inputs": without("f01")})
    extra = [*good, tensor("zz", "FP32", [3], [1.0, 2.0, 3.0])]
    assert "fields missing [], unexpected ['zz']" in refusal(learner, {"inputs": extra})
    uneven = [*without("f00"), tensor("f00", "FP32", [2], [1.0, 2.0])]
    assert "each feature's tensor must have shape [N], the same N for all" in refusal(learner, {"inputs": uneven})
    wide = [*without("f00"), tensor("f00", "FP32", [3, 2], [1.0] * 6)]
    assert "each feature's tensor must have shape [N]" in refusal(learner, {"inputs": wide})
    text = [*without("f00"), tensor("f00", "BYTES", [3], ["1", "2", "3"])]
    assert "feature 'f00' must be numbers, not BYTES" in refusal(learner, {"inputs": text})
    nan = [*without("f02"), tensor("f02", "FP32", [3], [1.0, math.nan, 2.0])]
    assert "feature 'f02' (column 2) holds NaN or infinite values" in refusal(learner, {"inputs": nan})
    empty = [tensor(name, "FP32", [0], []) for name in FEATURE_NAMES]
    assert "tensor 'f00': shape [0] lists 0" in refusal(learner, {"inputs": empty})
    # The field at fault is named, whichever tensor is first.
    assert "feature 'f00': each feature's tensor must have shape [N]" in refusal(learner, {"inputs": wide})
    assert "got [2] beside [3] of 'f01'" in refusal(learner, {"inputs": uneven})
    scalar = [tensor("f00", "FP32", [], [1.0]), *without("f00")]
    assert "feature 'f00': each feature's tensor must have shape [N]" in refusal(learner, {"inputs": scalar})
    assert "feature 'f00'" in refusal(learner, {"inputs": [*without("f00"), *scalar[:1]]})


def test_data_of_any_number_type_fitting_its_datatype_is_taken():
    """Strict is not narrow: integers for FP32, any number type the data fits, data nested as the shape."""
    learner, x = new_learner(), separable_data(MNIST_TASK, 2, seed=5).x
    codec = codec_for(MNIST_TASK)
    expected = learner.predict_proba(x)
    pixels = x.reshape(-1).tolist()  # Python ints
    for datatype in ("UINT8", "INT16", "INT64", "FP16", "FP32", "FP64"):
        answer = codec.answer_oip_in_process(learner, {"inputs": [tensor("x", datatype, [2, 28, 28], pixels)]})
        torch.testing.assert_close(answer, expected, rtol=0, atol=1e-6)
    nested = {"inputs": [tensor("x", "UINT8", [2, 28, 28], x.tolist())]}
    torch.testing.assert_close(codec.answer_oip_in_process(learner, nested), expected, rtol=0, atol=0)

    features = feature_learner()
    rows = feature_data(3, seed=3).x
    request = by_feature(rows)
    request["inputs"][5] = tensor("f05", "INT64", [3], [3, 4, 5])  # an hour of the day, say
    exact = rows.clone()
    exact[:, 5] = torch.tensor([3.0, 4.0, 5.0])
    torch.testing.assert_close(
        codec_for(FEATURE_TASK).answer_oip_in_process(features, request), features.predict_proba(exact)
    )


@pytest.mark.parametrize(
    "datatype,data,words",
    [
        ("INT64", [1, 1.5], "tensor 'x': INT64 data must be integers, not a float (1.5)"),
        ("INT64", [1, 2.0], "INT64 data must be integers, not a float (2.0)"),
        ("UINT8", [1, True], "UINT8 data must be integers, not a bool (true)"),
        ("FP32", [1.0, "1"], 'FP32 data must be numbers, not a string ("1")'),
        ("FP32", [1.0, None], "FP32 data must be numbers, not null"),
        ("FP32", [1.0, {"v": 1}], "FP32 data must be numbers, not an object"),
        ("BOOL", [True, 1], "BOOL data must be true or false, not an integer (1)"),
        ("BYTES", ["a", 1.5], "BYTES data must be strings, not a float (1.5)"),
        ("INT8", [1, 128], "out of bounds for int8"),
        ("UINT8", [1, -1], "out of bounds for uint8"),
        ("FP64", [1, 10**400], "int too large to convert to float"),
    ],
)
def test_data_is_read_only_as_its_own_datatype(datatype, data, words):
    with pytest.raises(RequestError) as refused:
        tensors_of([tensor("x", datatype, [2], data)], "inputs")
    assert words in str(refused.value)


def test_a_tensor_given_twice_is_refused_rather_than_one_replacing_the_other():
    with pytest.raises(RequestError, match="tensor 'x' is given twice"):
        tensors_of([tensor("x", "FP32", [1], [1.0]), tensor("x", "FP32", [1], [2.0])], "inputs")


@pytest.mark.parametrize("top_k", [0, 1001, 2.5, True, "3"])
def test_a_top_k_out_of_range_is_refused(top_k):
    codec = codec_for(LM_TASK)
    request = {**codec.encode_oip(sequences(WORDS.encode(TEXT), 8).x[:1]), "parameters": {"top_k": top_k}}
    assert "top_k must be an integer in [1, 1000]" in refusal(lm_learner(), request)


@pytest.mark.parametrize(
    "inputs,words",
    [
        pytest.param([tensor("text", "BYTES", [1, 1], ["the cat"])], 'expected one input tensor "text"', id="2d"),
        pytest.param([tensor("prompt", "BYTES", [1], ["the cat"])], 'expected one input tensor "text"', id="name"),
        pytest.param([tensor("text", "FP32", [1], [1.0])], '"text" must hold strings', id="numbers"),
        pytest.param([tensor("text", "BYTES", [1], [""])], "text encodes to no token", id="empty-text"),
    ],
)
def test_a_bad_request_for_text_is_refused(inputs, words):
    assert words in refusal(lm_learner(), {"inputs": inputs})


def test_a_response_without_the_expected_output_is_an_error_naming_it():
    codec = codec_for(MNIST_TASK)
    with pytest.raises(RequestError, match="the response has no output 'probabilities'"):
        codec.decode_oip({"outputs": [tensor("predictions", "FP32", [1], [0.5])]})


def test_tensors_keep_their_shape_and_text_through_json():
    texts = OipTensor("t", "BYTES", np.array([[b"a", "b"], ["c", "d"]], dtype=np.object_))
    numbers = OipTensor("n", "INT64", np.arange(6).reshape(2, 3))
    read = tensors_of(over_the_wire(request_body(texts, numbers))["inputs"], "inputs")
    assert read["t"].tolist() == [["a", "b"], ["c", "d"]]
    assert read["n"].dtype == np.int64 and read["n"].tolist() == [[0, 1, 2], [3, 4, 5]]
    assert request_body(numbers, parameters={"top_k": 3})["parameters"] == {"top_k": 3}
    assert "parameters" not in request_body(numbers)


def test_a_task_kind_without_a_codec_is_named():
    with pytest.raises(KeyError, match="no serving codec for task kind 'segmentation'"):
        codec_for(dataclasses.replace(MNIST_TASK, kind="segmentation"))


# ------------------------------------------------------------------------------------------ names


@pytest.mark.parametrize("version", [1, 7, 42, 1000])
def test_a_version_name_reads_back_as_its_version(version):
    assert versioned_name("alma", version) == f"alma-v{version}"
    assert version_of("alma", versioned_name("alma", version)) == version
    assert version_of("my.model", versioned_name("my.model", version)) == version


@pytest.mark.parametrize(
    "name", ["alma", "alma-v0", "alma-vx", "alma-v", "other-v3", "alma-v3-x", "alma-v03", "xalma-v3"]
)
def test_names_that_are_no_version_of_the_model_are_refused(name):
    assert version_of("alma", name) is None


def test_a_dot_in_the_model_name_is_no_wildcard():
    assert version_of("my.model", "myxmodel-v3") is None


def test_the_default_version_is_written_and_read_back(tmp_path):
    assert read_default(tmp_path) is None
    write_default(tmp_path, 3)
    assert read_default(tmp_path) == 3
    write_default(tmp_path, 12)
    assert read_default(tmp_path) == 12
    assert json.loads((tmp_path / DEFAULT_FILE).read_text()) == {"version": 12}


@pytest.mark.parametrize(
    "content",
    ["{not json", "[]", '{"v": 3}', '{"version": "3"}', '{"version": 0}', '{"version": true}', '{"version": 2.5}'],
)
def test_a_malformed_default_file_is_a_value_error_naming_it(tmp_path, content):
    (tmp_path / DEFAULT_FILE).write_text(content)
    with pytest.raises(ValueError, match=DEFAULT_FILE):
        read_default(tmp_path)
