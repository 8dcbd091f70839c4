"""Publishing to Triton Inference Server (``serving.kind: triton``): the Open Inference Protocol publisher,
with Triton's model repository written per version.

The flow, the names and the requests are :class:`serving.publishing.oip.OipPublisher`'s: load
``<model>-v<N>``, probe it, record the default and load ``<model>``, unload old versions. Triton loads
only names with a folder in its repository, so before each load this publisher writes that name's
folder (:mod:`serving.runtimes.triton.repository`), and after retiring versions it deletes the folders of the
names no longer loaded. ``<model>`` is an ensemble over ``<model>-v<N>``: loading it with another
step is the switch, which reads no weights (milliseconds), and a request sees the old version or the
new one, never neither (tests/test_serving_triton.py, benchmarks/results/swap_triton.md).
"""

from __future__ import annotations

import logging

from alma_daemon.config import Config, ServingConfig
from alma_daemon.core.checkpoints import CheckpointStore
from serving.protocols.triton_token import TritonToken, check_token
from serving.protocols.version_names import write_default
from serving.publishing.oip import OipClient, OipPublisher
from serving.publishing.publisher import Candidate, failing_as
from serving.runtimes.triton.repository import TritonRepository

log = logging.getLogger(__name__)


class TritonPublisher(OipPublisher):
    """Hot-swaps checkpoint versions into a running Triton, writing its model repository as it goes."""

    kind = "triton"

    @classmethod
    def from_config(cls, config: Config, store: CheckpointStore) -> TritonPublisher:
        check_token(config)
        client = OipClient(config.serving.inference_url, TritonToken.for_config(config))
        return cls(store, config.serving, client, config.daemon.keep_checkpoints)

    def __init__(
        self,
        store: CheckpointStore,
        serving: ServingConfig,
        client: OipClient,
        keep_checkpoints: int | None = None,
    ):
        super().__init__(store, serving, client, keep_checkpoints)
        self.repository = TritonRepository(store)

    def stage(self, candidate: Candidate) -> None:
        with failing_as("register"):
            self.repository.write_version(candidate.version)
        super().stage(candidate)

    def make_default(self, version: int) -> None:
        # The default file first: a crash before the ensemble is written leaves a file that names
        # another version than the live one, which the next publish sees and makes the default again
        # (OipPublisher.ensure_serving); the other order could leave a restarted server serving a
        # version that was never made live.
        with failing_as("set_default"):
            write_default(self.store.folder, version)
            self.repository.write_default(version)
            self.client.load(self.model)

    def retire(self, live: int) -> None:
        super().retire(live)
        # The folders of versions unloaded here, or refused by their probe earlier, are of no more use;
        # a version loaded again later gets its folder written again.
        with failing_as("delete"):
            removed = self.repository.remove_versions(set(self.client.models()))
        if removed:
            log.info("removed from Triton's model repository", extra={"versions": removed})
