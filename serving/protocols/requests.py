"""Reading a request strictly, in both protocols: the limits, the refusal, the JSON readers.

A request is read before anything converts it: a number is a JSON number (not true, not "1"), lists
nest regularly and at most :data:`MAX_DEPTH` deep; a refusal is one line naming the input or field
(:class:`RequestError`, answered with HTTP 400). :func:`nested_lists` and :func:`check_leaves` read
TorchServe's JSON bodies and the Open Inference Protocol's tensors (:mod:`serving.protocols.tensors`)
alike, so every server refuses the same inputs with the same words (:mod:`serving.protocols.codecs`).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from itertools import chain
from typing import Any

import numpy as np
import torch

#: Examples per request the handler accepts; bounds the memory one request can take.
MAX_INSTANCES = 4096
#: Characters of text per request a language model accepts: only the last ``input_shape[0]``
#: tokens of a text are read, and encoding a text is linear in its length.
MAX_TEXT_CHARS = 1 << 20
#: Levels of nested lists a request may hold: an example has a few dimensions, a batch one more.
MAX_DEPTH = 16
#: The JSON values that are numbers, by exact type: Python's ``bool`` is an ``int``, JSON's true is not a number.
NUMBER_TYPES = frozenset({int, float})


class RequestError(ValueError):
    """A request body that does not describe a batch of valid examples (answered with HTTP 400)."""


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


def nested_lists(doc: list[Any], what: str) -> Nested:
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


def instances_of(body: Any) -> list[Any]:
    """The ``instances`` list of a parsed KServe v1 style JSON body."""
    instances = body.get("instances") if isinstance(body, dict) else None
    if not isinstance(instances, list) or not instances:
        raise RequestError('expected a JSON object {"instances": [example, ...]} with at least one example')
    if len(instances) > MAX_INSTANCES:
        raise RequestError(f"at most {MAX_INSTANCES} instances per request; got {len(instances)}")
    return instances
