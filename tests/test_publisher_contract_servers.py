"""The publisher contract (tests/test_publisher_contract.py) against real servers: KServe's model
server and MLServer through the Open Inference Protocol publisher, and TorchServe. Each check
starts a server of its own over a fresh model store, and asks it as a client would.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from alma_daemon.config import build_config
from alma_daemon.data.datasets import MNIST_TASK
from alma_daemon.testing import Backend, yield_publisher_checks
from serving.protocols.codecs import codec_for
from serving.publishing import make_publisher
from serving.publishing.oip import OipPublisher
from serving.publishing.publisher import Publisher
from tests.helpers.servers import http_request
from tests.helpers.serving import CHECKS

pytestmark = pytest.mark.integration

MODEL = "alma"


def oip_backend(name: str, start: Callable[..., object], root: Path) -> Backend:
    """A backend on an OIP server that ``start(store_root)`` starts over a fresh model store."""
    stores = itertools.count()

    def make(**serving) -> Publisher:
        store_root = root / f"store{next(stores)}"
        server = start(store_root)
        config = build_config(
            {
                "daemon": {"checkpoint_dir": str(store_root)},
                "serving": {"kind": "kserve", "model_name": MODEL, **server.publisher_settings(), **serving},
            }
        )
        publisher = make_publisher(config)
        assert isinstance(publisher, OipPublisher)
        return publisher

    def served(publisher: Publisher, x: torch.Tensor) -> torch.Tensor:
        assert isinstance(publisher, OipPublisher)
        codec = codec_for(MNIST_TASK)
        return codec.decode_oip(publisher.client.infer(MODEL, codec.encode_oip(x)))

    return Backend(name, make, served)


def torchserve_backend(start: Callable[[], object], root: Path) -> Backend:
    stores = itertools.count()
    inference: dict[int, str] = {}

    def make(**serving) -> Publisher:
        server = start()
        config = build_config(
            {
                "daemon": {"checkpoint_dir": str(root / f"store{next(stores)}")},
                "serving": {
                    "kind": "torchserve",
                    "model_name": MODEL,
                    "management_url": server.management_url,
                    "inference_url": server.inference_url,
                    **serving,
                },
            }
        )
        publisher = make_publisher(config)
        assert publisher is not None
        inference[id(publisher)] = server.inference_url
        return publisher

    def served(publisher: Publisher, x: torch.Tensor) -> torch.Tensor:
        codec = codec_for(MNIST_TASK)
        body = json.dumps(codec.encode_json(x)).encode()
        status, answer = http_request(
            "POST", f"{inference[id(publisher)]}/predictions/{MODEL}", body, {"Content-Type": "application/json"}
        )
        assert status == 200, answer
        return codec.decode_json(json.loads(answer))

    return Backend("torchserve", make, served)


def run_check(backend: Backend, good_and_bad, name: str) -> None:
    (check,) = [c for c in yield_publisher_checks(backend, *good_and_bad) if c.name == name]
    check()


@pytest.mark.parametrize("name", CHECKS)
def test_kserve_publisher_contract(kserve_server, tmp_path, good_and_bad, name):
    run_check(oip_backend("kserve", kserve_server, tmp_path), good_and_bad, name)


@pytest.mark.parametrize("name", CHECKS)
def test_mlserver_publisher_contract(mlserver_server, tmp_path, good_and_bad, name):
    run_check(oip_backend("mlserver", mlserver_server, tmp_path), good_and_bad, name)


@pytest.mark.parametrize("name", CHECKS)
def test_torchserve_publisher_contract(torchserve_server, tmp_path, good_and_bad, name):
    run_check(torchserve_backend(torchserve_server, tmp_path), good_and_bad, name)
