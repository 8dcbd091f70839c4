"""Request and response formats for serving, one codec per task kind (``TaskInfo.kind``).

A codec is used on both sides of the wire. Server side (the TorchServe handler), :meth:`Codec.answer`
turns one request body into its response with the learner. Client side (the publisher's probe,
tests, benchmarks), :meth:`Codec.encode_request` asks for a batch of examples taken from a
validation sample, and :meth:`Codec.decode_response` turns a response into numbers, so a served
answer can be compared with the same answer computed in process.

Requests carry examples in the dataset's natural shape and raw units (MNIST 28x28 pixels 0-255,
CIFAR 32x32x3 HWC 0-255, text as a string), or, where the stream names its features
(``stream.features``, kept in the spec as ``task.extra["features"]``), as the named-feature JSON
objects its events carry; the model normalizes them itself. Answers are in the task's terms: class
names where ``task.classes`` names them, a regression's numbers. To serve a new kind of task,
subclass :class:`Codec` and decorate it with ``@register_codec("<kind>")``.

A request is read strictly, before anything converts it: a number is a JSON number (not true, not
"1"), lists nest regularly and at most :data:`MAX_DEPTH` deep; a refusal is one line naming the
input or field (:class:`RequestError`, answered with HTTP 400). :func:`nested_lists` and
:func:`check_leaves` read the Open Inference Protocol's tensors too (:mod:`serving.oip_codec`).
"""

from __future__ import annotations

import json
import math
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass
from itertools import chain
from typing import Any

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

#: Content type of a safetensors request body (the same as the wire format's records).
SAFETENSORS_CONTENT_TYPE = "application/vnd.alma.safetensors"
#: Name of the examples tensor in a safetensors request body, as in wire-format records.
SAFETENSORS_INPUT = "x"
#: Examples per request the handler accepts; bounds the memory one request can take.
MAX_INSTANCES = 4096
#: Characters of text per request a language model accepts: only the last ``input_shape[0]``
#: tokens of a text are read, and encoding a text is linear in its length.
MAX_TEXT_CHARS = 1 << 20
#: Levels of nested lists a request may hold: an example has a few dimensions, a batch one more.
MAX_DEPTH = 16
#: The JSON values that are numbers, by exact type: Python's ``bool`` is an ``int``, JSON's true is not a number.
NUMBER_TYPES = frozenset({int, float})

CODECS: dict[str, type[Codec]] = {}


class RequestError(ValueError):
    """A request body that does not describe a batch of valid examples (answered with HTTP 400)."""


def register_codec(kind: str) -> Callable[[type[Codec]], type[Codec]]:
    """Class decorator: serve tasks of ``kind`` with this codec."""

    def register(cls: type[Codec]) -> type[Codec]:
        if kind in CODECS:
            raise ValueError(f"a codec for task kind {kind!r} is registered twice")
        CODECS[kind] = cls
        return cls

    return register


def codec_for(task: TaskInfo) -> Codec:
    """The codec that serves ``task``; a clear error for a kind that nobody registered."""
    if task.kind not in CODECS:
        raise KeyError(f"no serving codec for task kind {task.kind!r}; known: {', '.join(sorted(CODECS))}")
    return CODECS[task.kind](task)


class Codec(ABC):
    """How one kind of task is asked and answered over HTTP."""

    def __init__(self, task: TaskInfo):
        self.task = task

    @abstractmethod
    def answer(self, learner: Learner, body: Any) -> dict:
        """The JSON response to one request body (a parsed JSON value, bytes or text); raises RequestError."""

    @abstractmethod
    def encode_request(self, x: torch.Tensor) -> dict:
        """A JSON request body asking about ``x``, examples as stored in a validation sample."""

    @abstractmethod
    def decode_response(self, payload: dict) -> torch.Tensor:
        """The numbers a response carries, as a float tensor (one row per instance)."""


def parse_json(body: Any) -> Any:
    """A JSON body as TorchServe hands it over: already parsed, or bytes when its decoding is off
    (or failed: TorchServe forwards a body it could not parse as it came)."""
    if isinstance(body, (bytes, bytearray)):
        try:
            return json.loads(body)
        except (json.JSONDecodeError, UnicodeDecodeError) as err:
            raise RequestError(f"body is not valid JSON: {err}") from None
        except RecursionError:
            raise RequestError("body is not valid JSON: its lists or objects are nested too deeply") from None
    return body


def described(value: Any) -> str:
    """``value`` as a refusal names it: its JSON kind and a short excerpt (``a string ("1")``)."""
    if value is None:
        return "null"
    if isinstance(value, (list, dict)):
        return "a list" if isinstance(value, list) else "an object"
    kind = {bool: "a bool", str: "a string", float: "a float", int: "an integer"}.get(type(value))
    if kind is None:
        return type(value).__name__
    excerpt = json.dumps(value[:32] if isinstance(value, str) else value)
    return f"{kind} ({excerpt}{'...' if isinstance(value, str) and len(value) > 32 else ''})"


@dataclass(frozen=True)
class Nested:
    """A JSON value read as nested lists of one shape: its ``shape``, its ``leaves`` in row-major
    order, and the Python types of the leaves (``kinds``), which say whether they are all numbers."""

    shape: list[int]
    leaves: list[Any]
    kinds: frozenset[type]


def nested_lists(doc: list, what: str) -> Nested:
    """``doc``'s leaves and shape, where its lists nest regularly; a RequestError naming ``what`` otherwise.

    One level at a time with C-level ``map``/``chain`` (as the wire reads an event): a batch of 4096
    MNIST examples takes about 0.2 s, and no leaf is converted before its type is known.
    """
    shape: list[int] = []
    level: list[Any] = [doc]
    while True:
        kinds = frozenset(map(type, level))
        if list not in kinds:
            return Nested(shape, level, kinds)
        if kinds != {list}:
            raise RequestError(f"{what} must be nested lists of one shape: lists beside values at depth {len(shape)}")
        sizes = set(map(len, level))
        if len(sizes) != 1:
            raise RequestError(
                f"{what} must be nested lists of one shape: lists of {min(sizes)} to {max(sizes)} items "
                f"at depth {len(shape) + 1}"
            )
        if len(shape) == MAX_DEPTH:
            raise RequestError(f"{what} are nested more than {MAX_DEPTH} levels deep")
        shape.append(sizes.pop())
        level = list(chain.from_iterable(level))


def check_leaves(nested: Nested, allowed: frozenset[type], what: str, wanted: str) -> None:
    """Raise a RequestError naming ``what`` and its first leaf whose type is not ``allowed``
    (``wanted`` says what they must be: "numbers", "integers", ...)."""
    odd = nested.kinds - allowed
    if odd:
        first = next(value for value in nested.leaves if type(value) in odd)
        raise RequestError(f"{what} must be {wanted}, not {described(first)}")


def float32_of(numbers: list[Any], what: str) -> torch.Tensor:
    """JSON numbers (ints and floats) as a float32 tensor; one beyond float32's range becomes infinite,
    which the examples' check refuses, one beyond float64's is refused here."""
    try:
        wide = np.array(numbers, dtype=np.float64)
    except OverflowError:
        raise RequestError(f"{what} hold a number beyond the float range") from None
    return torch.from_numpy(wide).to(torch.float32)


def instances_of(body: Any) -> list:
    """The ``instances`` list of a parsed KServe v1 style JSON body."""
    instances = body.get("instances") if isinstance(body, dict) else None
    if not isinstance(instances, list) or not instances:
        raise RequestError('expected a JSON object {"instances": [example, ...]} with at least one example')
    if len(instances) > MAX_INSTANCES:
        raise RequestError(f"at most {MAX_INSTANCES} instances per request; got {len(instances)}")
    return instances


class ExamplesCodec(Codec):
    """Fixed-shape inputs in raw units (images, features): how a classifier and a regression are asked.

    Values must be finite numbers (a JSON true, null or "1" is refused, not read as 1, NaN or 1.0);
    a task normalized as ``pixels`` also takes only values in [0, 255].

    Request: ``{"instances": [example, ...]}``, each example a nested list of shape
    ``task.input_shape``, or a safetensors body holding ``x`` (uint8 or float32, N x input_shape).
    Where the task names its features (``task.extra["features"]``), an example may also be a JSON
    object of them, as an event on the wire carries them (``{"age": 31, "income": 2.5}``; each
    field a list for a few examples; a ``y`` field is ignored, so an event can be posted as sent):
    alone as the body, in a list, or as the instances.
    """

    def __init__(self, task: TaskInfo):
        super().__init__(task)
        self.features = tuple(task.extra.get("features", ()))

    def encode_request(self, x: torch.Tensor) -> dict:
        return {"instances": x.tolist()}

    def inputs(self, body: Any) -> torch.Tensor:
        """The validated batch of raw examples a request carries."""
        if isinstance(body, (bytes, bytearray)) and bytes(body).lstrip()[:1] not in (b"{", b"["):
            return self.checked(self._from_safetensors(bytes(body)))
        return self.checked(self._from_json(parse_json(body)))

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

    def named(self, objects: list) -> torch.Tensor:
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


@register_codec("classification")
class ClassificationCodec(ExamplesCodec):
    """Examples (:class:`ExamplesCodec`) -> class probabilities.

    Response: ``{"predictions": [[p_0, ..., p_{C-1}], ...]}``, one row of probabilities per example;
    where the task names its classes (``task.classes``), ``{"predictions": [{"class": name,
    "probabilities": {name: p, ...}}, ...]}``, the most probable class and every class's probability.
    """

    def answer(self, learner: Learner, body: Any) -> dict:
        probabilities = learner.predict_proba(self.inputs(body))
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

    def decode_response(self, payload: dict) -> torch.Tensor:
        rows = payload["predictions"]
        if self.task.classes:
            rows = [[row["probabilities"][name] for name in self.task.classes] for row in rows]
        return torch.tensor(rows, dtype=torch.float32)


@register_codec("regression")
class RegressionCodec(ExamplesCodec):
    """Examples (:class:`ExamplesCodec`) -> the predicted number of each.

    Response: ``{"predictions": [v, ...]}``, one number per example.
    """

    def answer(self, learner: Learner, body: Any) -> dict:
        return {"predictions": learner.predict_outputs(self.inputs(body)).tolist()}

    def decode_response(self, payload: dict) -> torch.Tensor:
        return torch.tensor(payload["predictions"], dtype=torch.float32)


@register_codec("language_model")
class LanguageModelCodec(Codec):
    """Text -> the top-k of the next-token distribution after it.

    Request: ``{"instances": ["some text", ...], "top_k": 10}`` (``top_k`` optional), or a
    ``text/plain`` body holding one text; at most :data:`MAX_TEXT_CHARS` characters in all. Each text
    is encoded with the stream's tokenizer (saved in the checkpoint's spec) and its last
    ``input_shape[0]`` tokens are the context.
    Response: ``{"predictions": [{"tokens": [id, ...], "texts": [str, ...], "probabilities": [p, ...]}]}``,
    the k most likely next tokens of each text, most likely first.
    """

    TOP_K = 10
    MAX_TOP_K = 1000

    def __init__(self, task: TaskInfo):
        super().__init__(task)
        self.tokenizer = tokenizer_from_task(task)
        self.context = task.input_shape[0]

    def answer(self, learner: Learner, body: Any) -> dict:
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

    def encode_request(self, x: torch.Tensor) -> dict:
        return {"instances": [self.tokenizer.decode(row.tolist()) for row in x]}

    def decode_response(self, payload: dict) -> torch.Tensor:
        """One row per text over the whole vocabulary: the top-k probabilities, zeros elsewhere."""
        dense = torch.zeros(len(payload["predictions"]), self.task.num_classes)
        for row, prediction in enumerate(payload["predictions"]):
            dense[row, prediction["tokens"]] = torch.tensor(prediction["probabilities"])
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
