"""One checkpoint version as Triton's Python backend serves it: rebuilt from the model store, asked with
the protocol's tensors.

The backend calls the model's ``initialize`` with its arguments (strings: the model's folder in the
repository, the version being loaded, the instance's kind and device, the model's config as JSON);
:meth:`ServedVersion.from_backend_args` reads from them which checkpoint to rebuild and where, and
:meth:`ServedVersion.answer` turns a request's tensors into output tensors with the task's codec
(:mod:`serving.protocols.codecs`, the one KServe's and MLServer's runtimes use, so all three refuse the same
inputs with the same words). No ``triton_python_backend_utils`` here: the glue to it is :mod:`.model`.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from alma_daemon.core.checkpoint_index import CheckpointIndex
from alma_daemon.learners import Learner
from serving.protocols.codecs import Codec, codec_for
from serving.protocols.requests import RequestError
from serving.protocols.tensors import OipTensor
from serving.runtimes.checkpoint import served_learner
from serving.runtimes.triton.repository import MODEL_PARAMETER, store_root_of


@dataclass(frozen=True)
class ServedVersion:
    """Checkpoint ``version`` of a model, ready to answer the protocol's requests."""

    version: int
    learner: Learner
    codec: Codec

    @classmethod
    def from_backend_args(cls, args: Mapping[str, str]) -> ServedVersion:
        """The version Triton is loading, rebuilt from ``spec.json`` and safetensors weights (no pickle).

        Every name of the repository serves the checkpoint its Triton version number names
        (serving/runtimes/triton/repository.py); the model store is the folder the repository lies in, so the
        repository's files name no absolute path and the volume may be mounted anywhere.
        """
        config = json.loads(args["model_config"])
        model = config["parameters"][MODEL_PARAMETER]["string_value"]
        version = int(args["model_version"])
        store = CheckpointIndex(store_root_of(Path(args["model_repository"])), model)
        learner = served_learner(store, version, device_of(args))
        return cls(version, learner, codec_for(learner.task))

    def answer(self, inputs: Mapping[str, np.ndarray], parameters: str | Mapping[str, Any] | None) -> list[OipTensor]:
        """The output tensors for a request's input tensors and parameters (the backend gives them as
        JSON text); raises :class:`RequestError` for a request the codec refuses."""
        if isinstance(parameters, str):
            try:
                parameters = json.loads(parameters or "{}")
            except json.JSONDecodeError as err:
                raise RequestError(f"the request's parameters are not JSON: {err}") from None
        if not isinstance(parameters, Mapping):
            raise RequestError("the request's parameters must be an object")
        return self.codec.answer_oip(self.learner, inputs, parameters)


def device_of(args: Mapping[str, str]) -> str:
    """Where the instance Triton creates runs: its GPU where it gives one and torch sees it, else the CPU.

    The repository names no instance kind, so Triton makes one instance per GPU where there are GPUs
    and one on the CPU otherwise.
    """
    if args.get("model_instance_kind") == "GPU" and torch.cuda.is_available():
        # The publisher's probe compares served answers with the checkpoint's answers in fp32 on the
        # CPU; TF32 would differ by up to about 1e-2.
        torch.backends.cudnn.allow_tf32 = False
        torch.set_float32_matmul_precision("highest")
        return f"cuda:{int(args.get('model_instance_device_id', '0'))}"
    return "cpu"
