"""Requests and responses of the Open Inference Protocol v2 (OIP, "KServe v2"), one codec per task kind.

The protocol carries named tensors: a request ``{"inputs": [{"name", "shape", "datatype", "data"}]}``,
a response ``{"model_name", "model_version", "outputs": [...]}``, ``data`` flat in row-major order.
The same roles as :mod:`serving.codecs` (which this reuses for validation, so both servers refuse
the same inputs with the same words): server side (:mod:`serving.kserve_model`), :meth:`OipCodec.answer`
turns a request's tensors into output tensors with the learner; client side (the publisher's probe,
tests, benchmarks), :meth:`OipCodec.encode_request` and :meth:`OipCodec.decode_response`.

What each task kind takes and gives (docs/serving.md has the bodies side by side with TorchServe's):

- classification, regression: one input (``x`` by convention) of shape ``[N, *input_shape]`` in raw
  units, UINT8 or any number type; or, where the stream names its features, one input per feature,
  shape ``[N]``. Classification answers ``probabilities`` (FP32 ``[N, C]``) and, where the task
  names its classes, ``class`` (BYTES ``[N]``, the most probable); regression ``predictions`` (FP32 ``[N]``).
- language model: ``text`` (BYTES ``[N]``), the request parameter ``top_k`` (default 10); answers
  ``tokens`` (INT64 ``[N, k]``), ``probabilities`` (FP32 ``[N, k]``) and ``texts`` (BYTES ``[N, k]``),
  most likely first.

Requests are read strictly (:func:`tensor_of`), before numpy converts anything: each size at least 1,
data of the tensor's own datatype (no true or "1" for a number, no 1.5 for an integer), a datatype the
model takes; a refusal is one line naming the tensor or feature.
"""

from __future__ import annotations

import math
import reprlib
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from alma_daemon.data.datasets import TaskInfo
from alma_daemon.learners import Learner
from alma_daemon.measures import target_of
from serving.codecs import (
    MAX_DEPTH,
    NUMBER_TYPES,
    ExamplesCodec,
    LanguageModelCodec,
    Nested,
    RequestError,
    check_leaves,
    codec_for,
    described,
    nested_lists,
)

#: The protocol's tensor data types and the numpy types they are read as.
DATATYPES: dict[str, Any] = {
    "BOOL": np.bool_,
    "UINT8": np.uint8,
    "UINT16": np.uint16,
    "UINT32": np.uint32,
    "UINT64": np.uint64,
    "INT8": np.int8,
    "INT16": np.int16,
    "INT32": np.int32,
    "INT64": np.int64,
    "FP16": np.float16,
    "FP32": np.float32,
    "FP64": np.float64,
    "BYTES": np.object_,
}

#: The datatypes a model of examples or named features takes.
NUMBER_DATATYPES = tuple(datatype for datatype in DATATYPES if datatype not in ("BOOL", "BYTES"))
#: The JSON values each datatype's data may hold, by exact type, and how a refusal says it.
_LEAF_TYPES: dict[str, tuple[frozenset[type], str]] = {
    "BOOL": (frozenset({bool}), "true or false"),
    "BYTES": (frozenset({str}), "strings"),
    **{
        datatype: (frozenset({int}), "integers") if datatype[0] in "UI" else (NUMBER_TYPES, "numbers")
        for datatype in NUMBER_DATATYPES
    },
}
_DATATYPE_OF = {np.dtype(numpy_type): datatype for datatype, numpy_type in DATATYPES.items()}

OIP_CODECS: dict[str, type[OipCodec]] = {}


@dataclass(frozen=True)
class OipTensor:
    """One named tensor of a request or a response; ``data``'s shape is the tensor's."""

    name: str
    datatype: str
    data: np.ndarray

    def to_json(self) -> dict:
        """The tensor as the protocol's JSON carries it (``data`` flat, text as UTF-8 strings)."""
        flat = self.data.reshape(-1).tolist()
        if self.datatype == "BYTES":
            flat = [v.decode() if isinstance(v, bytes) else str(v) for v in flat]
        return {"name": self.name, "datatype": self.datatype, "shape": list(self.data.shape), "data": flat}


def check_datatype(name: str, datatype: Any) -> None:
    """Raise a RequestError naming the tensor where ``datatype`` is not one of the protocol's."""
    if datatype not in DATATYPES:
        raise RequestError(f"{_tensor(name)}: unknown datatype {_shown(datatype)} (known: {', '.join(DATATYPES)})")


def checked_shape(name: str, shape: Any) -> list[int]:
    """``shape`` if it lists at most :data:`MAX_DEPTH` sizes, each an integer of at least 1; a RequestError
    naming the tensor otherwise (numpy would take -1 as "whatever fits", and no model takes an empty tensor)."""
    if not isinstance(shape, list) or len(shape) > MAX_DEPTH:
        raise RequestError(f"{_tensor(name)}: shape must be a list of at most {MAX_DEPTH} sizes; got {_shown(shape)}")
    odd = next((size for size in shape if type(size) is not int or size < 1), None)
    if odd is not None:
        raise RequestError(
            f"{_tensor(name)}: shape {_shown(shape)} lists {_shown(odd)}; each size must be an integer of at least 1"
        )
    return shape


def tensor_of(name: str, shape: Any, datatype: Any, data: Any) -> np.ndarray:
    """The array a JSON tensor describes, its data checked against its datatype before any conversion
    (numpy would read true as 1, 1.5 as 1 for INT64 and "1" as 1.0); a RequestError naming the tensor
    otherwise. ``data`` is flat in row-major order, or nested as ``shape``."""
    what = _tensor(name)
    check_datatype(name, datatype)
    sizes = checked_shape(name, shape)
    if not isinstance(data, list):
        raise RequestError(f"{what}: data must be a list of values, not {described(data)}")
    nested = nested_lists(data, f"{what}: data")
    _check_fit(what, nested, sizes)
    allowed, wanted = _LEAF_TYPES[datatype]
    check_leaves(nested, allowed, f"{what}: {datatype} data", wanted)
    return _array(what, nested.leaves, datatype).reshape(sizes)


def tensors_of(entries: Any, where: str) -> dict[str, np.ndarray]:
    """The named tensors of a JSON ``inputs`` or ``outputs`` list, each checked against its shape and type."""
    if not isinstance(entries, list) or not entries:
        raise RequestError(f'expected "{where}": a list of tensors {{"name", "shape", "datatype", "data"}}')
    tensors: dict[str, np.ndarray] = {}
    for entry in entries:
        if not isinstance(entry, dict) or not {"name", "shape", "datatype", "data"} <= entry.keys():
            raise RequestError(f'each of "{where}" needs "name", "shape", "datatype" and "data"')
        name = entry["name"]
        if not isinstance(name, str) or not name:
            raise RequestError(f'each of "{where}" needs a "name" that is a non-empty string; got {_shown(name)}')
        if name in tensors:  # the second would silently replace the first
            raise RequestError(f"{_tensor(name)} is given twice")
        tensors[name] = tensor_of(name, entry["shape"], entry["datatype"], entry["data"])
    return tensors


def datatype_of(array: np.ndarray) -> str:
    """The protocol's datatype of ``array`` (BYTES for text, whichever way numpy holds it)."""
    return "BYTES" if array.dtype.kind in "OUS" else _DATATYPE_OF.get(array.dtype, str(array.dtype))


def _tensor(name: Any) -> str:
    return f"tensor {str(name)[:64]!r}"


def _shown(value: Any) -> str:
    """A short text for a value out of a request: a shape or datatype may be anything a client sent."""
    return reprlib.repr(value)


def _check_fit(what: str, nested: Nested, sizes: list[int]) -> None:
    """Raise a RequestError where data does not hold as many values as ``sizes`` or is nested otherwise."""
    # At most MAX_DEPTH sizes, each a JSON integer: their product is quick to compute, however large.
    if len(nested.leaves) != math.prod(sizes):
        raise RequestError(
            f"{what}: data does not fit its shape and datatype: {len(nested.leaves)} values for shape {_shown(sizes)}"
        )
    if len(nested.shape) > 1 and nested.shape != sizes:
        raise RequestError(f"{what}: data is nested as {nested.shape}, neither flat nor as its shape {sizes}")


def _array(what: str, leaves: list[Any], datatype: str) -> np.ndarray:
    """``leaves`` (of the types ``datatype`` allows) as numpy's type for ``datatype``."""
    try:
        # A float beyond FP16 or FP32 becomes infinite: the examples' check refuses it, with its own words.
        with np.errstate(over="ignore"):
            return np.array(leaves, dtype=DATATYPES[datatype])
    except OverflowError as err:  # an integer beyond its type: "Python integer 300 out of bounds for uint8"
        raise RequestError(f"{what}: data does not fit its shape and datatype: {err}") from None


def request_body(*tensors: OipTensor, parameters: Mapping[str, Any] | None = None) -> dict:
    """The JSON request holding ``tensors``."""
    body: dict[str, Any] = {"inputs": [t.to_json() for t in tensors]}
    if parameters:
        body["parameters"] = dict(parameters)
    return body


def register_oip_codec(kind: str) -> Callable[[type[OipCodec]], type[OipCodec]]:
    """Class decorator: serve tasks of ``kind`` over the protocol with this codec."""

    def register(cls: type[OipCodec]) -> type[OipCodec]:
        if kind in OIP_CODECS:
            raise ValueError(f"an OIP codec for task kind {kind!r} is registered twice")
        OIP_CODECS[kind] = cls
        return cls

    return register


def oip_codec_for(task: TaskInfo) -> OipCodec:
    """The codec that serves ``task`` over the protocol; a clear error for a kind nobody registered."""
    if task.kind not in OIP_CODECS:
        raise KeyError(f"no OIP codec for task kind {task.kind!r}; known: {', '.join(sorted(OIP_CODECS))}")
    return OIP_CODECS[task.kind](task)


class OipCodec(ABC):
    """How one kind of task is asked and answered in the protocol's tensors."""

    def __init__(self, task: TaskInfo):
        self.task = task

    @abstractmethod
    def answer(
        self, learner: Learner, inputs: Mapping[str, np.ndarray], parameters: Mapping[str, Any]
    ) -> list[OipTensor]:
        """The output tensors for a request's input tensors and parameters; raises RequestError."""

    @abstractmethod
    def encode_request(self, x: torch.Tensor) -> dict:
        """A JSON request asking about ``x``, examples as stored in a validation sample."""

    @abstractmethod
    def decode_response(self, payload: dict) -> torch.Tensor:
        """The numbers a JSON response carries, as a float tensor (one row per instance)."""

    @abstractmethod
    def signature(self) -> tuple[list[dict], list[dict]]:
        """The input and output tensors as the protocol's model metadata lists them (``-1``: any size)."""

    def answered_in_process(self, learner: Learner, request: dict) -> torch.Tensor:
        """The answer a server gives to the JSON ``request`` with ``learner``, computed here and decoded."""
        outputs = self.answer(learner, tensors_of(request.get("inputs"), "inputs"), request.get("parameters") or {})
        return self.decode_response({"outputs": [t.to_json() for t in outputs]})

    def outputs(self, payload: dict) -> dict[str, np.ndarray]:
        """A JSON response's output tensors, by name."""
        if not isinstance(payload, dict):
            raise RequestError("a response must be a JSON object")
        return tensors_of(payload.get("outputs"), "outputs")


class ExamplesOipCodec(OipCodec):
    """Fixed-shape inputs in raw units: one tensor of examples, or one tensor per named feature."""

    def __init__(self, task: TaskInfo):
        super().__init__(task)
        codec = codec_for(task)
        assert isinstance(codec, ExamplesCodec)  # classification and regression ask with examples
        self.examples = codec

    def inputs(self, inputs: Mapping[str, np.ndarray]) -> torch.Tensor:
        """The validated batch of raw examples a request's tensors carry."""
        features = set(self.examples.features)
        if features and (len(inputs) > 1 or set(inputs) <= features):
            return self._named(inputs)
        if len(inputs) != 1:
            raise RequestError(
                f"expected one input tensor of examples, shape [N, {', '.join(map(str, self.task.input_shape))}]; "
                f"got {len(inputs)}: {sorted(inputs)[:8]}"
            )
        ((name, array),) = inputs.items()
        _check_numbers(f"{_tensor(name)}: examples", array)
        x = torch.from_numpy(np.ascontiguousarray(array, dtype=np.uint8 if array.dtype == np.uint8 else np.float32))
        try:
            return self.examples.checked(x)
        except RequestError as err:  # the examples' words, naming the tensor that holds them
            raise RequestError(f"{_tensor(name)}: {err}") from None

    def _named(self, inputs: Mapping[str, np.ndarray]) -> torch.Tensor:
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
        for name in self.examples.features:  # others are refused by name below
            if name in inputs:
                _check_numbers(f"feature {name[:64]!r}", inputs[name])
        columns = {name: array.reshape(len(array)).tolist() for name, array in inputs.items()}
        return self.examples.checked(self.examples.named([columns]))

    def input_signature(self) -> list[dict]:
        if self.examples.features:
            return [_described(name, "FP32", -1) for name in self.examples.features]
        return [_described("x", "FP32", -1, *self.task.input_shape)]

    def encode_request(self, x: torch.Tensor) -> dict:
        if x.dtype == torch.uint8:
            return request_body(OipTensor("x", "UINT8", x.numpy()))
        return request_body(OipTensor("x", "FP32", x.float().numpy()))


@register_oip_codec("classification")
class ClassificationOipCodec(ExamplesOipCodec):
    """Examples -> ``probabilities`` (FP32 ``[N, C]``), ``class`` (BYTES ``[N]``) where classes are named (the
    version's decision), and ``threshold`` (FP32 ``[1]``) where a binary task's decision has one."""

    def answer(
        self, learner: Learner, inputs: Mapping[str, np.ndarray], parameters: Mapping[str, Any]
    ) -> list[OipTensor]:
        probabilities = learner.predict_proba(self.inputs(inputs)).float()
        outputs = [OipTensor("probabilities", "FP32", probabilities.numpy())]
        if self.task.classes:
            decided = target_of(self.task).decide(probabilities).tolist()
            names = np.array([self.task.classes[i] for i in decided], dtype=np.object_)
            outputs.append(OipTensor("class", "BYTES", names))
        if self.task.threshold is not None:
            # The version's decision: the positive class from this probability on (task.decision).
            outputs.append(OipTensor("threshold", "FP32", np.array([self.task.threshold], dtype=np.float32)))
        return outputs

    def signature(self) -> tuple[list[dict], list[dict]]:
        outputs = [_described("probabilities", "FP32", -1, self.task.num_classes)]
        if self.task.classes:
            outputs.append(_described("class", "BYTES", -1))
        if self.task.threshold is not None:
            outputs.append(_described("threshold", "FP32", 1))
        return self.input_signature(), outputs

    def decode_response(self, payload: dict) -> torch.Tensor:
        return torch.from_numpy(_output(self.outputs(payload), "probabilities").astype(np.float32))


@register_oip_codec("regression")
class RegressionOipCodec(ExamplesOipCodec):
    """Examples -> ``predictions`` (FP32 ``[N]``)."""

    def answer(
        self, learner: Learner, inputs: Mapping[str, np.ndarray], parameters: Mapping[str, Any]
    ) -> list[OipTensor]:
        return [OipTensor("predictions", "FP32", learner.predict_outputs(self.inputs(inputs)).float().numpy())]

    def signature(self) -> tuple[list[dict], list[dict]]:
        return self.input_signature(), [_described("predictions", "FP32", -1)]

    def decode_response(self, payload: dict) -> torch.Tensor:
        return torch.from_numpy(_output(self.outputs(payload), "predictions").astype(np.float32))


@register_oip_codec("language_model")
class LanguageModelOipCodec(OipCodec):
    """``text`` (BYTES ``[N]``) -> the top-k next tokens: ``tokens``, ``probabilities``, ``texts`` (``[N, k]``)."""

    def __init__(self, task: TaskInfo):
        super().__init__(task)
        codec = codec_for(task)
        assert isinstance(codec, LanguageModelCodec)
        self.text = codec

    def answer(
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
        predictions = self.text.answer(learner, request)["predictions"]
        return [
            OipTensor("tokens", "INT64", np.array([p["tokens"] for p in predictions], dtype=np.int64)),
            OipTensor("probabilities", "FP32", np.array([p["probabilities"] for p in predictions], dtype=np.float32)),
            OipTensor("texts", "BYTES", np.array([p["texts"] for p in predictions], dtype=np.object_)),
        ]

    def signature(self) -> tuple[list[dict], list[dict]]:
        outputs = [_described("tokens", "INT64", -1, -1), _described("probabilities", "FP32", -1, -1)]
        return [_described("text", "BYTES", -1)], [*outputs, _described("texts", "BYTES", -1, -1)]

    def encode_request(self, x: torch.Tensor) -> dict:
        texts = self.text.encode_request(x)["instances"]
        return request_body(OipTensor("text", "BYTES", np.array(texts, dtype=np.object_)))

    def decode_response(self, payload: dict) -> torch.Tensor:
        """One row per text over the whole vocabulary: the top-k probabilities, zeros elsewhere."""
        outputs = self.outputs(payload)
        tokens, probabilities = _output(outputs, "tokens"), _output(outputs, "probabilities")
        dense = torch.zeros(len(tokens), self.task.num_classes)
        dense.scatter_(1, torch.from_numpy(tokens.astype(np.int64)), torch.from_numpy(probabilities.astype(np.float32)))
        return dense


def _check_numbers(what: str, array: np.ndarray) -> None:
    """Raise a RequestError naming ``what`` where ``array`` is not of a number datatype (a model of
    examples or features reads no text, and true is no number)."""
    datatype = datatype_of(array)
    if datatype not in NUMBER_DATATYPES:
        raise RequestError(f"{what} must be numbers, not {datatype} (send FP32, UINT8 or another number type)")


def _output(outputs: Mapping[str, np.ndarray], name: str) -> np.ndarray:
    if name not in outputs:
        raise RequestError(f"the response has no output {name!r} (has {sorted(outputs)})")
    return outputs[name]


def _described(name: str, datatype: str, *shape: int) -> dict:
    return {"name": name, "datatype": datatype, "shape": list(shape)}
