"""MLServer over a model store: the server side of ``serving.kind: kserve`` on Seldon's MLServer 1.7.

The same names as on KServe's model server (:mod:`serving.protocols.version_names`, :mod:`serving.runtimes.kserve`),
plugged into MLServer's two extension points:

- :class:`CheckpointRepository`, the model repository (``model_repository_implementation`` in the
  server's settings.json): it turns ``<model>-v<N>`` and ``<model>`` into model settings, where
  MLServer's own repository would need a model-settings.json folder per name. Its list, which the
  repository index answers and which a start loads, is what this process holds; before it has
  loaded anything, the default version under both names (a restarted server serves the recorded
  default before the daemon asks anything of it).
- :class:`CheckpointRuntime`, the inference runtime (``implementation`` of those settings): loading
  ``<model>-v<N>`` rebuilds checkpoint N from its folder (``spec.json`` and ``weights.safetensors``,
  no pickle; a team's ``learner.model`` module bundled beside them); loading ``<model>`` reads the
  default file and serves that version with the learner ``<model>-v<N>`` holds, weights not read
  again. MLServer loads the new runtime of a name before it drops the old one, so a request sees
  the old version or the new one, never neither. Infer requests are answered with the task's codec
  (:mod:`serving.protocols.codecs`); a malformed one gets a 400 of its own.

Inference runs in MLServer's main process (``parallel_workers: 0``): both extension points share
:data:`HELD`, which worker processes would not. This module imports MLServer: only MLServer's
process imports it (``alma_daemon/local_servers/mlserver.py`` starts one).
"""

from __future__ import annotations

import asyncio
import builtins
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from mlserver import MLModel
from mlserver.errors import InferenceError, MLServerError
from mlserver.repository import ModelRepository
from mlserver.settings import ModelParameters, ModelSettings
from mlserver.types import InferenceRequest, InferenceResponse, ResponseOutput

from alma_daemon.core.checkpoint_index import SPEC, CheckpointIndex
from alma_daemon.learners import Learner
from serving.protocols.codecs import Codec, codec_for
from serving.protocols.requests import RequestError
from serving.protocols.tensors import tensors_of
from serving.protocols.version_names import read_default, version_of, versioned_name
from serving.runtimes.checkpoint import served_learner

#: Under MLServer's logger, whose handler writes the server's log.
log = logging.getLogger("mlserver.checkpoints")

NOT_FOUND = 404


@dataclass(frozen=True)
class Served:
    """What one loaded name answers with: checkpoint ``version``'s learner."""

    version: int
    learner: Learner


class HeldVersions:
    """The learners this process holds, by model name, and the checkpoint versions being rebuilt.

    Runtimes add and remove their names; the repository lists them. Everything runs on MLServer's
    event loop, so no lock is needed.
    """

    def __init__(self) -> None:
        self.by_name: dict[str, Served] = {}
        self.building: dict[int, asyncio.Future[Learner]] = {}
        self.started_loading = False

    async def build(self, store: CheckpointIndex, version: int, device: str) -> Learner:
        """Checkpoint ``version`` rebuilt from its folder, beside the event loop, which keeps answering."""
        pending = asyncio.ensure_future(asyncio.to_thread(build_learner, store, version, device))
        self.building[version] = pending
        try:
            return await pending
        finally:
            if self.building.get(version) is pending:
                del self.building[version]

    async def learner_of(self, store: CheckpointIndex, version: int, device: str) -> Learner:
        """The learner ``<model>-v<version>`` holds or is loading; built here only where neither."""
        held = self.by_name.get(versioned_name(store.model_name, version))
        if held is not None:
            return held.learner
        pending = self.building.get(version)
        if pending is not None:  # a start loads both names of the default at once
            return await pending
        return await self.build(store, version, device)


#: One per process: MLServer builds the repository and each runtime on its own.
HELD = HeldVersions()


def build_learner(store: CheckpointIndex, version: int, device: str) -> Learner:
    """Checkpoint ``version`` of ``store``, ready to answer."""
    try:
        learner = served_learner(store, version, device)
    except FileNotFoundError as err:
        raise MLServerError(str(err), NOT_FOUND) from err
    except Exception as err:
        # MLServer answers any other exception with a bare "Internal Server Error": the publisher's
        # error would not say what failed.
        raise MLServerError(f"checkpoint version {version} in {store.folder} cannot be loaded: {err}", 500) from err
    log.info("checkpoint version %d read from %s", version, store.path(version))
    return learner


class CheckpointRuntime(MLModel):
    """One name of :class:`CheckpointRepository`: ``<model>-v<N>`` or ``<model>`` (module docstring).

    Its settings' ``parameters.extra`` hold ``store_root``, ``model``, ``device`` and, for a
    versioned name, ``version``.
    """

    def __init__(self, settings: ModelSettings):
        super().__init__(settings)
        self.served: Served | None = None
        self.codec: Codec | None = None

    async def load(self) -> bool:
        HELD.started_loading = True
        extra = self.settings.parameters.extra
        store, device = CheckpointIndex(Path(extra["store_root"]), extra["model"]), extra["device"]
        if "version" in extra:
            # Built again even where the name is held: a version withdrawn and redone under the same
            # number (serving/publishing/live_pointer.py) has other weights.
            version = int(extra["version"])
            learner = await HELD.build(store, version, device)
        else:
            version = default_version(store)
            learner = await HELD.learner_of(store, version, device)
            log.info("%s serves version %d", self.name, version)
        self.codec = codec_for(learner.task)
        self.served = Served(version, learner)
        HELD.by_name[self.name] = self.served
        return True

    async def unload(self) -> bool:
        # MLServer unloads a name's old runtime after its new one took the name: only this runtime's own entry goes.
        if self.served is not None and HELD.by_name.get(self.name) is self.served:
            del HELD.by_name[self.name]
        return True

    async def predict(self, payload: InferenceRequest) -> InferenceResponse:
        served, codec = self.served, self.codec
        assert served is not None and codec is not None  # MLServer sends requests to ready models only
        request = payload.model_dump(mode="json", exclude_none=True)
        parameters: dict[str, Any] = payload.parameters.model_dump(exclude_none=True) if payload.parameters else {}
        try:
            inputs = tensors_of(request.get("inputs"), "inputs")
            # The forward pass runs beside the event loop, which keeps taking requests meanwhile.
            outputs = await asyncio.to_thread(codec.answer_oip, served.learner, inputs, parameters)
        except RequestError as err:
            raise InferenceError(str(err)) from None
        return InferenceResponse(
            model_name=self.name,
            model_version=str(served.version),
            id=payload.id,
            outputs=[ResponseOutput(**tensor.to_json()) for tensor in outputs],
        )


def default_version(store: CheckpointIndex) -> int:
    """The version the default file names; a 404 where none is recorded."""
    try:
        version = read_default(store.folder)
    except ValueError as err:
        raise MLServerError(str(err)) from None
    if version is None:
        raise MLServerError(
            f"no default version recorded in {store.folder}: load {store.model_name}-v<N> first", NOT_FOUND
        )
    return version


class CheckpointRepository(ModelRepository):
    """The versions of one model of a model store, as MLServer's model repository (module docstring).

    MLServer passes ``model_repository_implementation_args`` of its settings as keyword arguments:
    ``store_root`` (``daemon.checkpoint_dir``), ``model`` (``serving.model_name``) and ``device``
    (auto: CUDA where present).
    """

    def __init__(self, root: str, store_root: str, model: str, device: str = "auto"):
        self.store = CheckpointIndex(Path(store_root).resolve(), model)
        self.model = model
        self.device = ("cuda" if torch.cuda.is_available() else "cpu") if device == "auto" else device
        if self.device.startswith("cuda"):
            # The publisher's probe compares served answers with the checkpoint's answers in fp32 on the
            # CPU; TF32 would differ by up to about 1e-2.
            torch.backends.cudnn.allow_tf32 = False
            torch.set_float32_matmul_precision("highest")

    # MLServer's name for the method shadows the built-in in this class: builtins.list below.
    async def list(self) -> builtins.list[ModelSettings]:
        names = sorted(HELD.by_name) if HELD.started_loading else self._names_at_start()
        return [self.settings(name) for name in names]

    async def find(self, name: str) -> builtins.list[ModelSettings]:
        return [self.settings(name)]

    def settings(self, name: str) -> ModelSettings:
        """The settings MLServer loads ``name`` with; a 404 for a name this repository does not serve."""
        extra: dict[str, Any] = {"store_root": str(self.store.root), "model": self.model, "device": self.device}
        if name != self.model:
            version = version_of(self.model, name)
            if version is None:
                raise MLServerError(
                    f"no model {name!r} here: this server serves {self.model!r} and {self.model!r}-v<N>, "
                    f"the versions in {self.store.folder}",
                    NOT_FOUND,
                )
            extra["version"] = version
        return ModelSettings(
            name=name,
            implementation=CheckpointRuntime,
            parameters=ModelParameters(uri=str(self.store.folder), extra=extra),
        )

    def _names_at_start(self) -> builtins.list[str]:
        """Both names of the recorded default version, where one is recorded and still on disk."""
        try:
            version = read_default(self.store.folder)
        except ValueError as err:
            log.warning("the default version cannot be read; serving none until the daemon sets one: %s", err)
            return []
        if version is None:
            return []
        if not (self.store.path(version) / SPEC).is_file():
            log.warning("the default version %d is no longer on disk; serving none until the daemon sets one", version)
            return []
        return [versioned_name(self.model, version), self.model]
