"""Triton's Python backend model: one checkpoint version of the model store, as each version folder's
model.py (serving/runtimes/triton/repository.py) hands it to the backend.

It runs in the backend's stub process, a Python of its own with torch (scripts/setup_triton.sh's
virtualenv where ``alma serve --kind triton`` runs Triton), the only place ``triton_python_backend_utils``
can be imported. ``initialize`` rebuilds the checkpoint (:mod:`.served`: spec.json and safetensors, no
pickle); a checkpoint that cannot be rebuilt fails the load, with the reason in Triton's answer to the
publisher. ``execute`` answers each request with the task's codec: a request the codec refuses gets
Triton's 400 with the codec's words, any other failure a 500 for that request alone.
"""

from __future__ import annotations

import traceback
from typing import Any

import triton_python_backend_utils as pb_utils

from alma_daemon.infra.priority import lower_priority_once_loaded
from serving.protocols.requests import RequestError
from serving.runtimes.triton.served import ServedVersion


class TritonPythonModel:
    """The Python backend's model (its interface: ``initialize``, ``execute``, ``finalize``)."""

    served: ServedVersion

    def initialize(self, args: dict[str, str]) -> None:
        self.served = ServedVersion.from_backend_args(args)
        pb_utils.Logger.log_info(f"{args.get('model_name')} serves checkpoint version {self.served.version}")
        lower_priority_once_loaded()

    def execute(self, requests: list[Any]) -> list[Any]:
        return [self._answer(request) for request in requests]

    def _answer(self, request: Any) -> Any:  # a pb_utils.InferenceRequest -> a pb_utils.InferenceResponse
        try:
            inputs = {tensor.name(): tensor.as_numpy() for tensor in request.inputs()}
            outputs = self.served.answer(inputs, request.parameters())
        except RequestError as err:
            return pb_utils.InferenceResponse(error=pb_utils.TritonError(str(err), pb_utils.TritonError.INVALID_ARG))
        except Exception as err:  # one request's failure, not the batch's
            pb_utils.Logger.log_error(f"answering a request failed: {traceback.format_exc()}")
            return pb_utils.InferenceResponse(error=pb_utils.TritonError(f"{type(err).__name__}: {err}"))
        return pb_utils.InferenceResponse([pb_utils.Tensor(tensor.name, tensor.data) for tensor in outputs])

    def finalize(self) -> None:
        pb_utils.Logger.log_info(f"checkpoint version {self.served.version} unloaded")
