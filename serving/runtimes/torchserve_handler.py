"""The TorchServe handler of every alma model archive (``torch-model-archiver --handler``).

The archive carries the checkpoint's ``spec.json`` and ``weights.safetensors``; the handler
rebuilds the learner from them (no pickle, no TorchScript), so one handler serves every learner,
grown or not. Requests and responses are TorchServe's JSON of the task kind's codec
(:mod:`serving.protocols.codecs`).
The worker's Python environment must have alma-daemon installed, as the handler imports it; a team's
``learner.model`` module comes bundled in the archive (:mod:`serving.runtimes.bundled_model`).

TorchServe takes the one class defined in this module as the entry point: keep it the only one.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import torch

from alma_daemon.core.checkpoint_index import SPEC
from alma_daemon.core.checkpoints import load_checkpoint
from alma_daemon.infra.priority import lower_priority_once_loaded
from alma_daemon.learners import Learner
from serving.protocols.codecs import Codec, codec_for
from serving.protocols.requests import RequestError
from serving.runtimes.bundled_model import register_bundled_module

log = logging.getLogger(__name__)


class AlmaHandler:
    """Answers batches of requests with the predictions of one checkpoint's learner."""

    def __init__(self) -> None:
        self.learner: Learner | None = None
        self.codec: Codec | None = None

    def initialize(self, context: Any) -> None:
        properties = context.system_properties
        gpu = properties.get("gpu_id")
        device = f"cuda:{gpu}" if gpu is not None and torch.cuda.is_available() else "cpu"
        if device != "cpu":
            # The publisher's probe compares served answers with the checkpoint's answers in fp32 on
            # the CPU; TF32 convolutions (cuDNN's default) would differ by up to about 1e-2.
            torch.backends.cudnn.allow_tf32 = False
            torch.set_float32_matmul_precision("highest")
        register_bundled_module(properties["model_dir"], Path(properties["model_dir"]) / SPEC)
        self.learner = load_checkpoint(properties["model_dir"], device)
        self.codec = codec_for(self.learner.task)
        log.info("model loaded", extra={"learner": self.learner.name, "device": device})
        lower_priority_once_loaded()

    def handle(self, data: list[dict[str, Any]], context: Any) -> list[dict[str, Any]]:
        """One response per request of TorchServe's batch; a malformed request gets a 400 of its own."""
        assert self.learner is not None and self.codec is not None  # TorchServe calls initialize first
        responses = []
        for index, request in enumerate(data):
            try:
                responses.append(self.codec.answer_json(self.learner, request.get("body", request.get("data"))))
            except RequestError as err:
                context.set_response_status(400, str(err), index)
                responses.append({"error": str(err)})
        return responses
