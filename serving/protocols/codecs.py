"""Requests and responses for serving, one codec per task kind (``TaskInfo.kind``), in both protocols.

One registry (:data:`CODECS`, fed by the entry points of group ``alma_daemon.codecs``): a codec answers its task kind in TorchServe's JSON (the ``*_json``
methods: ``{"instances": [...]}`` in, ``{"predictions": [...]}`` out) and in the Open Inference
Protocol's tensors (the ``*_oip`` methods, :mod:`serving.protocols.tensors`). Both protocols read
their examples with the same checks, so every server refuses the same inputs with the same words.

A codec is used on both sides of the wire. Server side (the runtimes of :mod:`serving.runtimes`),
:meth:`Codec.answer_json` and :meth:`Codec.answer_oip` turn one request into its response with the
learner. Client side (the publisher's probe, tests, benchmarks), :meth:`Codec.encode_json` /
:meth:`Codec.encode_oip` ask for a batch of examples taken from a validation sample, and
:meth:`Codec.decode_json` / :meth:`Codec.decode_oip` turn a response into numbers, so a served answer
can be compared with the same answer computed in process.

Requests carry examples in the dataset's natural shape and raw units (MNIST 28x28 pixels 0-255,
CIFAR 32x32x3 HWC 0-255, text as a string), or, where the stream names its features
(``stream.features``, kept in the spec as ``task.extra["features"]``), as the named-feature JSON
objects its events carry (in the Open Inference Protocol: one tensor per feature); the model
normalizes them itself. Answers are in the task's terms: class names where ``task.classes`` names
them, a regression's numbers. To serve a new kind of task, subclass :class:`Codec` and name it in an
entry point of group ``alma_daemon.codecs`` under the task kind (CONTRIBUTING.md, "Adding a plugin"). Requests are read strictly (:mod:`serving.protocols.requests`).

What each task kind takes and gives in the Open Inference Protocol (docs/serving.md has the bodies
side by side with TorchServe's):

- classification, regression: one input (``x`` by convention) of shape ``[N, *input_shape]`` in raw
  units, UINT8 or any number type; or, where the stream names its features, one input per feature,
  shape ``[N]``. Classification answers ``probabilities`` (FP32 ``[N, C]``) and, where the task
  names its classes, ``class`` (BYTES ``[N]``, the most probable); regression ``predictions`` (FP32 ``[N]``).
- language model: ``text`` (BYTES ``[N]``), the request parameter ``top_k`` (default 10); answers
  ``tokens`` (INT64 ``[N, k]``), ``probabilities`` (FP32 ``[N, k]``) and ``texts`` (BYTES ``[N, k]``),
  most likely first.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections.abc import Mapping
from typing import Any, cast

import numpy as np
import safetensors
import safetensors.torch
import torch

from alma_daemon.data.datasets import TaskInfo
from alma_daemon.data.events import named_features
from alma_daemon.data.text import tokenizer_from_task
from alma_daemon.data.wire import RejectedRecord
from alma_daemon.learners import Learner
from alma_daemon.measures import target_of
from alma_daemon.registry import CODECS as CODEC_REGISTRY
from alma_daemon.registry import Registry
from serving.protocols.requests import (
    MAX_INSTANCES,
    MAX_TEXT_CHARS,
    NUMBER_TYPES,
    RequestError,
    check_leaves,
    described,
    float32_of,
    instances_of,
    nested_lists,
    parse_json,
)
from serving.protocols.tensors import (
    OipTensor,
    check_numbers,
    datatype_of,
    request_body,
    tensor_label,
    tensors_of,
)

#: Content type of a safetensors request body (the same as the wire format's records).
SAFETENSORS_CONTENT_TYPE = "application/vnd.alma.safetensors"
#: Name of the examples tensor in a safetensors request body, as in wire-format records.
SAFETENSORS_INPUT = "x"

#: The codecs by the task kind they serve (``TaskInfo.kind``).
CODECS = cast("Registry[type[Codec]]", CODEC_REGISTRY)


def codec_for(task: TaskInfo) -> Codec:
    """The codec that serves ``task``; a clear error for a kind that nobody registered."""
    if task.kind not in CODECS:
        raise KeyError(f"no serving codec for task kind {task.kind!r}; known: {', '.join(CODECS)}")
    return CODECS[task.kind](task)


class Codec(ABC):
    """How one kind of task is asked and answered: in TorchServe's JSON and in the Open Inference Protocol."""

    def __init__(self, task: TaskInfo):
        self.task = task

    # TorchServe's JSON

    @abstractmethod
    def answer_json(self, learner: Learner, body: Any) -> dict[str, Any]:
        """The JSON response to one request body (a parsed JSON value, bytes or text); raises RequestError."""

    @abstractmethod
    def encode_json(self, x: torch.Tensor) -> dict[str, Any]:
        """A JSON request body asking about ``x``, examples as stored in a validation sample."""

    @abstractmethod
    def decode_json(self, payload: dict[str, Any]) -> torch.Tensor:
        """The numbers a response carries, as a float tensor (one row per instance)."""

    # The Open Inference Protocol's tensors

    @abstractmethod
    def answer_oip(
        self, learner: Learner, inputs: Mapping[str, np.ndarray], parameters: Mapping[str, Any]
    ) -> list[OipTensor]:
        """The output tensors for a request's input tensors and parameters; raises RequestError."""

    @abstractmethod
    def encode_oip(self, x: torch.Tensor) -> dict[str, Any]:
        """A JSON request asking about ``x``, examples as stored in a validation sample."""

    @abstractmethod
    def decode_oip(self, payload: dict[str, Any]) -> torch.Tensor:
        """The numbers a JSON response carries, as a float tensor (one row per instance)."""

    @abstractmethod
    def oip_signature(self) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
        """The input and output tensors as the protocol's model metadata lists them (``-1``: any size)."""

    def answer_oip_in_process(self, learner: Learner, request: dict[str, Any]) -> torch.Tensor:
        """The answer a server gives to the JSON ``request`` with ``learner``, computed here and decoded."""
        outputs = self.answer_oip(learner, tensors_of(request.get("inputs"), "inputs"), request.get("parameters") or {})
        return self.decode_oip({"outputs": [t.to_json() for t in outputs]})

    def oip_outputs(self, payload: dict[str, Any]) -> dict[str, np.ndarray]:
        """A JSON response's output tensors, by name."""
        if not isinstance(payload, dict):
            raise RequestError("a response must be a JSON object")
        return tensors_of(payload.get("outputs"), "outputs")


class ExamplesCodec(Codec):
    """Fixed-shape inputs in raw units (images, features): how a classifier and a regression are asked.

    Values must be finite numbers (a JSON true, null or "1" is refused, not read as 1, NaN or 1.0);
    a task normalized as ``pixels`` also takes only values in [0, 255].

    TorchServe's JSON: ``{"instances": [example, ...]}``, each example a nested list of shape
    ``task.input_shape``, or a safetensors body holding ``x`` (uint8 or float32, N x input_shape).
    Where the task names its features (``task.extra["features"]``), an example may also be a JSON
    object of them, as an event on the wire carries them (``{"age": 31, "income": 2.5}``; each
    field a list for a few examples; a ``y`` field is ignored, so an event can be posted as sent):
    alone as the body, in a list, or as the instances.

    The Open Inference Protocol: one tensor of examples, or one tensor per named feature.
    """

    def __init__(self, task: TaskInfo):
        super().__init__(task)
        self.features = tuple(task.extra.get("features", ()))

    def encode_json(self, x: torch.Tensor) -> dict[str, Any]:
        return {"instances": x.tolist()}

    def encode_oip(self, x: torch.Tensor) -> dict[str, Any]:
        if x.dtype == torch.uint8:
            return request_body(OipTensor("x", "UINT8", x.numpy()))
        return request_body(OipTensor("x", "FP32", x.float().numpy()))

    def examples_from_json(self, body: Any) -> torch.Tensor:
        """The validated batch of raw examples a TorchServe request body carries."""
        if isinstance(body, (bytes, bytearray)) and bytes(body).lstrip()[:1] not in (b"{", b"["):
            return self.checked(self._from_safetensors(bytes(body)))
        return self.checked(self._from_json(parse_json(body)))

    def examples_from_oip(self, inputs: Mapping[str, np.ndarray]) -> torch.Tensor:
        """The validated batch of raw examples a request's tensors carry."""
        features = set(self.features)
        if features and (len(inputs) > 1 or set(inputs) <= features):
            return self._from_feature_tensors(inputs)
        if len(inputs) != 1:
            raise RequestError(
                f"expected one input tensor of examples, shape [N, {', '.join(map(str, self.task.input_shape))}]; "
                f"got {len(inputs)}: {sorted(inputs)[:8]}"
            )
        ((name, array),) = inputs.items()
        check_numbers(f"{tensor_label(name)}: examples", array)
        x = torch.from_numpy(np.ascontiguousarray(array, dtype=np.uint8 if array.dtype == np.uint8 else np.float32))
        try:
            return self.checked(x)
        except RequestError as err:  # the examples' words, naming the tensor that holds them
            raise RequestError(f"{tensor_label(name)}: {err}") from None

    def checked(self, x: torch.Tensor) -> torch.Tensor:
        """``x`` if it is a batch of valid examples in raw units; a RequestError saying why not otherwise."""
        shape = tuple(self.task.input_shape)
        if x.dim() != len(shape) + 1 or tuple(x.shape[1:]) != shape:
            raise RequestError(f"each example must have shape {list(shape)}; got a batch of shape {list(x.shape)}")
        if not 1 <= len(x) <= MAX_INSTANCES:
            raise RequestError(f"a request holds 1 to {MAX_INSTANCES} examples; got {len(x)}")
        if x.dtype.is_floating_point:
            finite = torch.isfinite(x)
            if not bool(finite.all()):
                raise RequestError(f"{self._where_not(finite)} NaN or infinite values")
            low, high = float(x.min()), float(x.max())
            # Normalized inputs (mean 0, std 1) would be silently misread as raw pixels.
            if self.task.pixels and (low < 0 or high > 255):
                raise RequestError(f"values must be raw units in [0, 255]; got min {low:g}, max {high:g}")
        return x

    def _where_not(self, finite: torch.Tensor) -> str:
        """Who holds a value that is not finite: the first such feature where the task names them."""
        if not self.features or finite.dim() != 2:
            return "examples contain"
        column = int((~finite).any(0).nonzero()[0])
        return f"feature {self.features[column][:64]!r} (column {column}) holds"

    def _from_json(self, doc: Any) -> torch.Tensor:
        if isinstance(doc, dict) and ("instances" not in doc or "instances" in self.features):
            return self.named([doc])
        instances = instances_of({"instances": doc} if isinstance(doc, list) else doc)
        if any(isinstance(example, dict) for example in instances):
            return self.named(instances)
        # Strict before any conversion: torch would read true as 1 and a numeric string as its number.
        nested = nested_lists(instances, "instances")
        check_leaves(nested, NUMBER_TYPES, "instances", "nested lists of numbers")
        return float32_of(nested.leaves, "instances").reshape(nested.shape)

    def named(self, objects: list[Any]) -> torch.Tensor:
        """The examples of named-feature objects (each field one value, or a list of one per example),
        with the rules of an event's fields (data/events.py)."""
        if not self.features:
            raise RequestError(
                'this model names no features (stream.features): send {"instances": [example, ...]}, '
                "each example a nested list of numbers"
            )
        expected = set(self.features)
        rows, count = [], 0
        for doc in objects:
            if not isinstance(doc, dict):
                raise RequestError("instances must be all named-feature objects or all lists of numbers")
            missing, extra = sorted(expected - doc.keys()), sorted(doc.keys() - expected - {"y"})
            if missing or extra:
                raise RequestError(f"fields missing {missing[:8]}, unexpected {[str(k)[:64] for k in extra[:8]]}")
            first = doc[self.features[0]]
            try:
                rows.append(named_features(doc, self.features, len(first) if type(first) is list else None))
            except RejectedRecord as rejection:
                raise RequestError(rejection.detail) from None
            count += len(rows[-1])
            if count > MAX_INSTANCES:
                raise RequestError(f"at most {MAX_INSTANCES} examples per request")
        return torch.cat(rows)

    def _from_feature_tensors(self, inputs: Mapping[str, np.ndarray]) -> torch.Tensor:
        """The examples of one tensor per named feature; a refusal names the first feature at fault."""
        first_name, first = next(iter(inputs.items()))
        count = first.shape[0] if first.ndim else None

        def fits(array: np.ndarray) -> bool:
            # [N, 1] is taken as [N]; one value per example either way.
            return array.ndim in (1, 2) and array.shape[1:] in ((), (1,)) and array.shape[0] == count

        misfit = next((name for name, array in inputs.items() if not fits(array)), None)
        if misfit is not None:
            beside = f" beside {list(first.shape)} of {first_name[:64]!r}" if misfit != first_name else ""
            raise RequestError(
                f"feature {misfit[:64]!r}: each feature's tensor must have shape [N], the same N for all; "
                f"got {list(inputs[misfit].shape)}{beside}"
            )
        for name in self.features:  # others are refused by name below
            if name in inputs:
                check_numbers(f"feature {name[:64]!r}", inputs[name])
        columns = {name: array.reshape(len(array)).tolist() for name, array in inputs.items()}
        return self.checked(self.named([columns]))

    @staticmethod
    def _from_safetensors(body: bytes) -> torch.Tensor:
        try:
            tensors = safetensors.torch.load(body)
        except (safetensors.SafetensorError, ValueError) as err:
            raise RequestError(f"body is neither JSON nor safetensors: {err}") from None
        if SAFETENSORS_INPUT not in tensors:
            raise RequestError(f"safetensors body has no tensor {SAFETENSORS_INPUT!r} (found {sorted(tensors)})")
        x = tensors[SAFETENSORS_INPUT]
        if x.dtype not in (torch.uint8, torch.float32):
            raise RequestError(f"tensor {SAFETENSORS_INPUT!r} must be uint8 or float32; got {x.dtype}")
        return x

    def oip_input_signature(self) -> list[dict[str, Any]]:
        if self.features:
            return [_described(name, "FP32", -1) for name in self.features]
        return [_described("x", "FP32", -1, *self.task.input_shape)]


class ClassificationCodec(ExamplesCodec):
    """Examples (:class:`ExamplesCodec`) -> class probabilities.

    TorchServe's JSON: ``{"predictions": [[p_0, ..., p_{C-1}], ...]}``, one row of probabilities per
    example; where the task names its classes (``task.classes``), ``{"predictions": [{"class": name,
    "probabilities": {name: p, ...}}, ...]}``, the most probable class and every class's probability.

    The Open Inference Protocol: ``probabilities`` (FP32 ``[N, C]``), ``class`` (BYTES ``[N]``) where
    classes are named (the version's decision), and ``threshold`` (FP32 ``[1]``) where a binary task's
    decision has one.
    """

    def answer_json(self, learner: Learner, body: Any) -> dict[str, Any]:
        probabilities = learner.predict_proba(self.examples_from_json(body))
        names = self.task.classes
        # The version's decision: the positive class from this probability on (task.decision).
        decision = {} if self.task.threshold is None else {"threshold": self.task.threshold}
        if not names:
            return {"predictions": probabilities.tolist(), **decision}
        best = target_of(self.task).decide(probabilities).tolist()
        return {
            "predictions": [
                {"class": names[i], "probabilities": dict(zip(names, row))}
                for i, row in zip(best, probabilities.tolist())
            ],
            **decision,
        }

    def decode_json(self, payload: dict[str, Any]) -> torch.Tensor:
        rows = payload["predictions"]
        if self.task.classes:
            rows = [[row["probabilities"][name] for name in self.task.classes] for row in rows]
        return torch.tensor(rows, dtype=torch.float32)

    def answer_oip(
        self, learner: Learner, inputs: Mapping[str, np.ndarray], parameters: Mapping[str, Any]
    ) -> list[OipTensor]:
        probabilities = learner.predict_proba(self.examples_from_oip(inputs)).float()
        outputs = [OipTensor("probabilities", "FP32", probabilities.numpy())]
        if self.task.classes:
            decided = target_of(self.task).decide(probabilities).tolist()
            names = np.array([self.task.classes[i] for i in decided], dtype=np.object_)
            outputs.append(OipTensor("class", "BYTES", names))
        if self.task.threshold is not None:
            # The version's decision: the positive class from this probability on (task.decision).
            outputs.append(OipTensor("threshold", "FP32", np.array([self.task.threshold], dtype=np.float32)))
        return outputs

    def oip_signature(self) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
        outputs = [_described("probabilities", "FP32", -1, self.task.num_classes)]
        if self.task.classes:
            outputs.append(_described("class", "BYTES", -1))
        if self.task.threshold is not None:
            outputs.append(_described("threshold", "FP32", 1))
        return self.oip_input_signature(), outputs

    def decode_oip(self, payload: dict[str, Any]) -> torch.Tensor:
        return torch.from_numpy(_output(self.oip_outputs(payload), "probabilities").astype(np.float32))


class RegressionCodec(ExamplesCodec):
    """Examples (:class:`ExamplesCodec`) -> the predicted number of each.

    TorchServe's JSON: ``{"predictions": [v, ...]}``, one number per example. The Open Inference
    Protocol: ``predictions`` (FP32 ``[N]``).
    """

    def answer_json(self, learner: Learner, body: Any) -> dict[str, Any]:
        return {"predictions": learner.predict_outputs(self.examples_from_json(body)).tolist()}

    def decode_json(self, payload: dict[str, Any]) -> torch.Tensor:
        return torch.tensor(payload["predictions"], dtype=torch.float32)

    def answer_oip(
        self, learner: Learner, inputs: Mapping[str, np.ndarray], parameters: Mapping[str, Any]
    ) -> list[OipTensor]:
        return [
            OipTensor("predictions", "FP32", learner.predict_outputs(self.examples_from_oip(inputs)).float().numpy())
        ]

    def oip_signature(self) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
        return self.oip_input_signature(), [_described("predictions", "FP32", -1)]

    def decode_oip(self, payload: dict[str, Any]) -> torch.Tensor:
        return torch.from_numpy(_output(self.oip_outputs(payload), "predictions").astype(np.float32))


class LanguageModelCodec(Codec):
    """Text -> the top-k of the next-token distribution after it.

    TorchServe's JSON: ``{"instances": ["some text", ...], "top_k": 10}`` (``top_k`` optional), or a
    ``text/plain`` body holding one text; at most :data:`MAX_TEXT_CHARS` characters in all. Each text
    is encoded with the stream's tokenizer (saved in the checkpoint's spec) and its last
    ``input_shape[0]`` tokens are the context.
    Response: ``{"predictions": [{"tokens": [id, ...], "texts": [str, ...], "probabilities": [p, ...]}]}``,
    the k most likely next tokens of each text, most likely first.

    The Open Inference Protocol: ``text`` (BYTES ``[N]``) -> ``tokens``, ``probabilities``, ``texts``
    (``[N, k]``), read and answered as the JSON is.
    """

    TOP_K = 10
    MAX_TOP_K = 1000

    def __init__(self, task: TaskInfo):
        super().__init__(task)
        self.tokenizer = tokenizer_from_task(task)
        self.context = task.input_shape[0]

    def answer_json(self, learner: Learner, body: Any) -> dict[str, Any]:
        texts, top_k = self._texts_and_k(body)
        predictions = []
        for text in texts:
            tokens = self._encode(text)
            # One forward per text: texts have different lengths, and one short request stays cheap.
            distribution = learner.predict_proba(tokens[None])[0, -1]
            probabilities, ids = distribution.topk(min(top_k, len(distribution)))
            predictions.append(
                {
                    "tokens": ids.tolist(),
                    "texts": [self.tokenizer.decode([i]) for i in ids.tolist()],
                    "probabilities": probabilities.tolist(),
                }
            )
        return {"predictions": predictions}

    def encode_json(self, x: torch.Tensor) -> dict[str, Any]:
        return {"instances": [self.tokenizer.decode(row.tolist()) for row in x]}

    def decode_json(self, payload: dict[str, Any]) -> torch.Tensor:
        """One row per text over the whole vocabulary: the top-k probabilities, zeros elsewhere."""
        dense = torch.zeros(len(payload["predictions"]), self.task.num_classes)
        for row, prediction in enumerate(payload["predictions"]):
            dense[row, prediction["tokens"]] = torch.tensor(prediction["probabilities"])
        return dense

    def answer_oip(
        self, learner: Learner, inputs: Mapping[str, np.ndarray], parameters: Mapping[str, Any]
    ) -> list[OipTensor]:
        if set(inputs) != {"text"} or inputs["text"].ndim != 1:
            raise RequestError(f'expected one input tensor "text", BYTES of shape [N]; got {sorted(inputs)[:8]}')
        if datatype_of(inputs["text"]) != "BYTES":
            raise RequestError(f'"text" must hold strings (datatype BYTES), not {datatype_of(inputs["text"])}')
        texts = [t.decode(errors="replace") if isinstance(t, bytes) else t for t in inputs["text"].tolist()]
        if not all(isinstance(t, str) for t in texts):
            raise RequestError('"text" must hold strings (datatype BYTES)')
        request = {"instances": texts, **({"top_k": parameters["top_k"]} if "top_k" in parameters else {})}
        predictions = self.answer_json(learner, request)["predictions"]
        return [
            OipTensor("tokens", "INT64", np.array([p["tokens"] for p in predictions], dtype=np.int64)),
            OipTensor("probabilities", "FP32", np.array([p["probabilities"] for p in predictions], dtype=np.float32)),
            OipTensor("texts", "BYTES", np.array([p["texts"] for p in predictions], dtype=np.object_)),
        ]

    def oip_signature(self) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
        outputs = [_described("tokens", "INT64", -1, -1), _described("probabilities", "FP32", -1, -1)]
        return [_described("text", "BYTES", -1)], [*outputs, _described("texts", "BYTES", -1, -1)]

    def encode_oip(self, x: torch.Tensor) -> dict[str, Any]:
        texts = self.encode_json(x)["instances"]
        return request_body(OipTensor("text", "BYTES", np.array(texts, dtype=np.object_)))

    def decode_oip(self, payload: dict[str, Any]) -> torch.Tensor:
        """One row per text over the whole vocabulary: the top-k probabilities, zeros elsewhere."""
        outputs = self.oip_outputs(payload)
        tokens, probabilities = _output(outputs, "tokens"), _output(outputs, "probabilities")
        dense = torch.zeros(len(tokens), self.task.num_classes)
        dense.scatter_(1, torch.from_numpy(tokens.astype(np.int64)), torch.from_numpy(probabilities.astype(np.float32)))
        return dense

    def _texts_and_k(self, body: Any) -> tuple[list[str], int]:
        texts, top_k = self._parsed(body)
        characters = sum(map(len, texts))
        if characters > MAX_TEXT_CHARS:
            # Encoding is linear in the text; only its last input_shape[0] tokens are read.
            raise RequestError(f"at most {MAX_TEXT_CHARS} characters of text per request; got {characters}")
        return texts, top_k

    def _parsed(self, body: Any) -> tuple[list[str], int]:
        """The texts and ``top_k`` of a body: a text/plain one (TorchServe hands it over as a string) or JSON."""
        if isinstance(body, str):
            return [body], self.TOP_K
        body = parse_json(body)
        texts = instances_of(body)
        odd = next((text for text in texts if not isinstance(text, str)), None)
        if odd is not None:
            raise RequestError(f"each instance must be a string of text, not {described(odd)}")
        top_k = body.get("top_k", self.TOP_K)
        if isinstance(top_k, bool) or not isinstance(top_k, int) or not 1 <= top_k <= self.MAX_TOP_K:
            raise RequestError(f"top_k must be an integer in [1, {self.MAX_TOP_K}]; got {described(top_k)}")
        return texts, top_k

    def _encode(self, text: str) -> torch.Tensor:
        try:
            ids = self.tokenizer.encode(text)
        except KeyError as err:
            raise RequestError(f"text cannot be encoded: {err}") from None
        if not ids:
            raise RequestError("text encodes to no token")
        return torch.tensor(ids[-self.context :], dtype=torch.long)


def max_abs_difference(expected: torch.Tensor, served: torch.Tensor) -> float:
    """Largest absolute difference between in-process and served answers (inf if shapes differ)."""
    if expected.shape != served.shape:
        return math.inf
    return float((expected.float() - served.float()).abs().max()) if expected.numel() else 0.0


def _output(outputs: Mapping[str, np.ndarray], name: str) -> np.ndarray:
    if name not in outputs:
        raise RequestError(f"the response has no output {name!r} (has {sorted(outputs)})")
    return outputs[name]


def _described(name: str, datatype: str, *shape: int) -> dict[str, Any]:
    return {"name": name, "datatype": datatype, "shape": list(shape)}
