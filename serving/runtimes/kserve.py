"""KServe's model server over a model store: the server side of ``serving.kind: kserve``.

:class:`CheckpointRepository` is KServe's model repository (the protocol's load and unload) for one
model of the store, with the names of :mod:`serving.protocols.version_names`: loading ``<model>-v<N>`` rebuilds
checkpoint N from its folder (``spec.json`` and ``weights.safetensors``, no pickle; a team's
``learner.model`` module bundled beside them), loading ``<model>`` serves, under that name too,
the version the default file names: the same object, so the switch costs no load and a request
sees the old version or the new one, never neither. :class:`CheckpointModel` answers the protocol's
infer requests with the task's codec (:mod:`serving.protocols.codecs`); a malformed request gets a 400 of its
own. :func:`serve` runs the server: on one address, its model repository closed to requests without
the token (:mod:`serving.runtimes.repository_guard`), at normal priority until it serves a version and at
``serving.niceness`` from then on (:class:`YieldOnceServing`). This module imports KServe: only the
server's process (:mod:`serving.runtimes.kserve_server`) imports it.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import kserve
import kserve.model_server
import numpy as np
import torch
from kserve.errors import InvalidInput
from kserve.protocol.infer_type import InferInput, InferOutput, InferRequest, InferResponse

from alma_daemon.core.checkpoint_index import CheckpointIndex
from alma_daemon.infra.priority import lower_own_priority
from alma_daemon.learners import Learner
from alma_daemon.logs import NOTICE
from serving.protocols.codecs import Codec, codec_for
from serving.protocols.requests import RequestError
from serving.protocols.tensors import OipTensor, check_datatype, checked_shape, tensor_of
from serving.protocols.version_names import read_default, version_of, versioned_name
from serving.runtimes.checkpoint import served_learner
from serving.runtimes.repository_guard import RepositoryGuard

log = logging.getLogger(__name__)


#: A forward pass expected to take less than this runs on the server's event loop, not a thread.
INLINE_SECONDS = 0.001


class CheckpointModel(kserve.Model):
    """One checkpoint version's learner, answering the protocol's infer requests."""

    def __init__(self, name: str, version: int, learner: Learner):
        super().__init__(name)
        self.version = version
        self.learner = learner
        self.codec: Codec = codec_for(learner.task)
        #: A moving average of the answers' seconds per example (None until the first answer, which
        #: runs on a thread): it decides where the next forward pass runs (:meth:`_answer`).
        self.seconds_per_example: float | None = None
        self.ready = True

    async def _answer(self, inputs: dict[str, np.ndarray], parameters: dict[str, Any]) -> list[OipTensor]:
        """The codec's answer: on the event loop where the forward pass is expected to be shorter than
        handing it to a thread (an MLP at batch 1: 0.1 ms; the hop cost a quarter of the requests per
        second, benchmarks/results/swap_kserve_vs_torchserve.md), else on a thread, beside the loop,
        which keeps taking requests and loads meanwhile."""
        examples = max((len(array) for array in inputs.values() if array.ndim), default=1)

        def timed() -> tuple[list[OipTensor], float]:
            # Timed where it runs: a wait for the thread is not the model's cost.
            began = time.perf_counter()
            return self.codec.answer_oip(self.learner, inputs, parameters), time.perf_counter() - began

        expected = self.seconds_per_example * examples if self.seconds_per_example is not None else None
        outputs, seconds = (
            timed() if expected is not None and expected < INLINE_SECONDS else await asyncio.to_thread(timed)
        )
        per_example = seconds / examples
        previous = self.seconds_per_example
        self.seconds_per_example = per_example if previous is None else 0.9 * previous + 0.1 * per_example
        return outputs

    def get_input_types(self) -> list[dict[str, Any]]:
        return self.codec.oip_signature()[0]

    def get_output_types(self) -> list[dict[str, Any]]:
        return self.codec.oip_signature()[1]

    async def predict(
        self, payload: InferRequest, headers: dict[str, str] | None = None, response_headers: Any = None
    ) -> InferResponse:
        if not isinstance(payload, InferRequest):
            raise InvalidInput("this server answers the Open Inference Protocol v2 only: POST /v2/models/<name>/infer")
        try:
            outputs = await self._answer(read_inputs(payload.inputs), dict(payload.parameters or {}))
        except RequestError as err:
            raise InvalidInput(str(err)) from None
        answers = []
        for tensor in outputs:
            answer = InferOutput(tensor.name, list(tensor.data.shape), tensor.datatype)
            answer.set_data_from_numpy(tensor.data, binary_data=False)
            answers.append(answer)
        return InferResponse(
            response_id=payload.id or str(uuid.uuid4()),
            model_name=payload.model_name or self.name,
            infer_outputs=answers,
            model_version=str(self.version),
        )


def read_inputs(tensors: list[InferInput]) -> dict[str, np.ndarray]:
    """A request's input tensors by name, read by :func:`serving.protocols.tensors.tensor_of`, which refuses
    what KServe's ``as_numpy`` would take: a size of -1 ("whatever fits"), 1.5 for INT64 (read as 1),
    "1" for FP32 (read as 1.0). A tensor of the binary data extension is read by KServe, its
    datatype and shape checked first."""
    if not tensors:
        raise RequestError('expected "inputs": a list of tensors {"name", "shape", "datatype", "data"}')
    arrays: dict[str, np.ndarray] = {}
    for tensor in tensors:
        if tensor.name in arrays:  # the second would silently replace the first
            raise RequestError(f"tensor {tensor.name!r} is given twice")
        if isinstance(tensor.data, list):
            arrays[tensor.name] = tensor_of(tensor.name, tensor.shape, tensor.datatype, tensor.data)
            continue
        check_datatype(tensor.name, tensor.datatype)
        checked_shape(tensor.name, tensor.shape)
        try:
            arrays[tensor.name] = tensor.as_numpy()
        except (TypeError, ValueError) as err:
            raise RequestError(f"tensor {tensor.name!r}: data does not fit its shape and datatype: {err}") from None
    return arrays


class CheckpointRepository(kserve.ModelRepository):
    """The versions of one model of a model store, loaded by name (module docstring).

    One writer (the daemon's publisher, under its serving lock) loads and unloads; inference reads
    the registry at any time, and a name is replaced in one dictionary assignment.
    """

    def __init__(self, store_root: Path, model: str, device: str):
        super().__init__(models_dir=str(store_root))
        self.store = CheckpointIndex(store_root, model)
        self.model = model
        self.device = device
        #: Called each time ``model`` is made to serve a version (:func:`serve` sets it).
        self.on_serving: Callable[[], None] = _nothing

    async def load(self, name: str) -> bool:
        if name == self.model:
            self.serve_default(await self._loaded_default())
            return True
        version = version_of(self.model, name)
        if version is None:
            raise ValueError(
                f"no model {name!r} here: this server serves '{self.model}' and '{self.model}-v<N>', "
                f"the versions in {self.store.folder}"
            )
        self.update(await asyncio.get_running_loop().run_in_executor(None, self.build, version))
        return True

    def unload(self, name: str) -> None:
        """Forget ``name``; stop its model only where no other name serves it (the default's name and
        its version's are one object)."""
        model = self.get_model(name)
        if model is None:
            raise KeyError(f"model with name {name} does not exist")  # KServe answers 404 for it
        del self.models[name]
        if all(other is not model for other in self.models.values()):
            model.stop()

    def load_default_at_start(self) -> None:
        """Serve the recorded default version, if any is recorded and still on disk (a restart)."""
        try:
            version = read_default(self.store.folder)
        except ValueError as err:
            log.warning(f"the default version cannot be read; serving none until the daemon sets one: {err}")
            return
        if version is None:
            return
        if not self.store.path(version).is_dir():
            log.warning(f"the default version {version} is no longer on disk; serving none until the daemon sets one")
            return
        model = self.build(version)
        self.update(model)
        self.serve_default(model)

    def serve_default(self, model: CheckpointModel) -> None:
        self.update(model, name=self.model)
        log.log(NOTICE, f"{self.model} serves version {model.version}", extra={"version": model.version})
        self.on_serving()

    async def _loaded_default(self) -> CheckpointModel:
        version = read_default(self.store.folder)
        if version is None:
            raise ValueError(f"no default version recorded in {self.store.folder}: load {self.model}-v<N> first")
        loaded = self.get_model(versioned_name(self.model, version))
        if isinstance(loaded, CheckpointModel) and loaded.ready:
            return loaded
        model = await asyncio.get_running_loop().run_in_executor(None, self.build, version)
        self.update(model)
        return model

    def build(self, version: int) -> CheckpointModel:
        """Checkpoint ``version`` rebuilt from its folder, ready to answer."""
        return CheckpointModel(
            versioned_name(self.model, version), version, served_learner(self.store, version, self.device)
        )


def _nothing() -> None:
    pass


class YieldOnceServing:
    """Lowers the server's priority to ``niceness`` the first time it is called, once the server serves.

    A server at niceness 19 from its first instruction waits for spare CPU for everything: on a busy
    machine (2 cores, 4 busy loops) it had not answered after 300 s, where at normal priority it
    started in under 30 s (benchmarks/results/serve_start_busy.md). So it starts at normal priority
    and yields the cores to training only once clients get answers: after the first version is made
    the one ``serving.model_name`` serves, or, for a restarted server that serves the recorded version
    from its start, once it listens. Every swap after that loads at ``niceness``, as it did.
    """

    def __init__(self, niceness: int):
        self.niceness = niceness
        self.done = niceness == 0

    def __call__(self) -> None:
        if self.done:
            return
        self.done = True
        lower_own_priority(self.niceness)
        log.log(NOTICE, f"serving: the server runs at niceness {self.niceness} from now on")


def listen_on(host: str) -> None:
    """Make KServe's REST server listen on ``host``.

    KServe 0.21's binds every interface whatever it is told (``host="0.0.0.0"`` in
    kserve/protocol/rest/server.py) and builds it inside ``ModelServer.start``; the class that start
    looks up is replaced by one that binds ``host``.
    """
    base = kserve.model_server.RESTServer

    class RESTServerOnHost(base):  # type: ignore[valid-type,misc]
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            self.config.host = host

    kserve.model_server.RESTServer = RESTServerOnHost


def close_repository(token: str | None) -> None:
    """Put :class:`RepositoryGuard` in front of KServe's app where there is a token (None: left open)."""
    if token is None:
        log.warning("the model repository API (load, unload) is open to every client that reaches the port")
        return
    kserve.model_server.app.add_middleware(RepositoryGuard, token=token)


class BadRequestsOnOneLine(logging.Filter):
    """KServe logs each request it refuses with a traceback, at ERROR: a client's bad input is not a
    fault of the server, and gets one warning line."""

    def filter(self, record: logging.LogRecord) -> bool:
        error = record.exc_info[1] if record.exc_info else None
        if isinstance(error, InvalidInput):
            record.msg, record.args, record.exc_info, record.exc_text = f"bad request: {error}", (), None, None
            record.levelno, record.levelname = logging.WARNING, "WARNING"
        return True


def serve(
    store_root: Path,
    model: str,
    http_port: int,
    device: str,
    *,
    host: str = "127.0.0.1",
    token: str | None,
    niceness: int = 0,
) -> None:
    """Run KServe's model server on ``host:http_port`` over ``store_root``'s ``model`` until SIGTERM,
    its repository closed with ``token`` (None: open), at ``niceness`` once it serves."""
    if device.startswith("cuda"):
        # The publisher's probe compares served answers with the checkpoint's answers in fp32 on the
        # CPU; TF32 would differ by up to about 1e-2.
        torch.backends.cudnn.allow_tf32 = False
        torch.set_float32_matmul_precision("highest")
    repository = CheckpointRepository(store_root, model, device)
    repository.load_default_at_start()
    yield_once_serving = YieldOnceServing(niceness)
    if repository.get_model(model) is not None:
        # A restarted server serves the recorded version as soon as it listens: it yields then.
        kserve.model_server.app.router.add_event_handler("startup", yield_once_serving)
    repository.on_serving = yield_once_serving
    listen_on(host)
    close_repository(token)
    server = kserve.ModelServer(
        http_port=http_port,
        enable_grpc=False,
        workers=1,  # one registry: KServe's extra workers are processes that would each hold their own
        registered_models=repository,
        enable_latency_logging=False,
        grace_period=5,
    )
    # Lines for every request (access log, KServe's timings) would drown the server's log and
    # grow it without end.
    for name in ("uvicorn.access", "kserve.trace"):
        logging.getLogger(name).setLevel(logging.WARNING)
    logging.getLogger("kserve").addFilter(BadRequestsOnOneLine())
    # KServe 0.21 answers through a response class FastAPI deprecates: a warning per route, not ours to fix.
    warnings.filterwarnings("ignore", message="ORJSONResponse is deprecated")
    server.start([])
