"""Publishing to a server of the Open Inference Protocol v2 (``serving.kind: kserve``).

Each checkpoint version is loaded under its own name, ``<model>-v<N>`` (:mod:`serving.oip_names`),
through the protocol's model repository extension, probed through ``/v2/models/<model>-v<N>/infer``,
then made the default: the publisher records N in the model store's default file and asks the
server to load ``<model>``, the name clients call, which now serves N. KServe's model server as
``alma serve --kind kserve`` runs it (:mod:`serving.kserve_model`) keeps the loaded version and
serves it under the second name: an atomic switch, no request fails. Old versions are unloaded,
keeping ``serving.keep_versions`` besides the live one; a request already running on one finishes
on it (the server frees a model once nothing holds it), so no drain is needed.

Every request is the protocol's, so the same publisher drives another OIP server whose model
repository maps the two kinds of name to checkpoints this way (MLServer: :mod:`serving.mlserver_runtime`).
The repository requests carry the token of ``serving.repository_token_file`` where there is one
(:mod:`serving.oip_token`): KServe's model server as ``alma serve --kind kserve`` runs it refuses them
without it.
The server reads the checkpoints and the default file from the model store: it must see the files
the daemon writes (one machine, or one shared volume, at any path), as TorchServe must.
"""

from __future__ import annotations

import logging

from alma_daemon.config import ServingConfig
from alma_daemon.core.checkpoints import CheckpointStore
from alma_daemon.logs import NOTICE
from alma_daemon.observability.progress import told_while
from serving.bundled_model import bundle_module_source
from serving.codecs import max_abs_difference
from serving.oip_client import LOAD_TIMEOUT_SECONDS, OipClient, OipError
from serving.oip_codec import oip_codec_for
from serving.oip_names import read_default, version_of, versioned_name, write_default
from serving.publisher import PROBE_EXAMPLES, Candidate, Publisher, PublishError, failing_as, guard_settings

log = logging.getLogger(__name__)

#: Largest difference allowed between served and in-process answers (as for TorchServe): the same
#: weights differ only by float rounding; a wrong model, version or normalization by far more.
PROBE_TOLERANCE = 1e-3


class OipPublisher(Publisher):
    """Hot-swaps checkpoint versions into a running Open Inference Protocol server."""

    kind = "kserve"

    def __init__(
        self,
        store: CheckpointStore,
        serving: ServingConfig,
        client: OipClient,
        keep_checkpoints: int | None = None,
    ):
        super().__init__(
            store,
            serving.promotion_margin,
            **guard_settings(serving),
            keep_checkpoints=keep_checkpoints,
        )
        self.client = client
        self.model = serving.model_name
        self.keep_versions = serving.keep_versions

    def ensure_serving(self, live: int) -> None:
        # A restarted server holds what its default file named at its start; it may have missed a
        # switch, and another version's name is not this one's.
        if not self.client.model_ready(versioned_name(self.model, live)):
            log.warning("live version not loaded; loading it again", extra={"version": live})
            self.stage(self.load_candidate(live))
        # The server loads the default file's version at its start, and only this publisher loads
        # the name: a file naming the live version and a ready name mean the name serves it.
        with failing_as("set_default"):
            if read_default(self.store.folder) == live and self.client.model_ready(self.model):
                return
        self.make_default(live)

    def stage(self, candidate: Candidate) -> None:
        name = versioned_name(self.model, candidate.version)
        with failing_as("register"):
            bundle_module_source(self.store.path(candidate.version))
        # Loaded again even where the name is loaded: a version withdrawn and redone under the same
        # number (serving/live_pointer.py) has other weights, and a load is cheap.
        with failing_as("register"), told_while(lambda seconds: self._tell_loading(candidate.version, seconds)):
            self.client.load(name)
        try:
            self._probe(candidate, name)
        except PublishError:
            self._unload_quietly(name)
            raise

    def make_default(self, version: int) -> None:
        with failing_as("set_default"):
            write_default(self.store.folder, version)
            self.client.load(self.model)

    def retire(self, live: int) -> None:
        with failing_as("delete"):
            loaded = self._loaded_versions()
        others = sorted(v for v in loaded if v != live)
        kept = others[max(0, len(others) - self.keep_versions) :] if self.keep_versions else []
        for version in others:
            if version not in kept:
                with failing_as("delete"):
                    self.client.unload(versioned_name(self.model, version))
                log.info("unloaded", extra={"version": version})

    def served_versions(self) -> list[int]:
        """Versions loaded on the server under their own name that are still in the model store."""
        with failing_as("register"):
            loaded = self._loaded_versions()
        stored = set(self.store.versions())
        return sorted(v for v in loaded if v in stored)

    def _loaded_versions(self) -> list[int]:
        names = self.client.models()
        return [v for v in (version_of(self.model, name) for name in names) if v is not None]

    def _tell_loading(self, version: int, seconds: float) -> None:
        log.log(
            NOTICE,
            f"the model server is loading version {version}: {seconds:.0f} s so far (up to {LOAD_TIMEOUT_SECONDS:g} s)",
            extra={"version": version},
        )

    def _probe(self, candidate: Candidate, name: str) -> None:
        """Ask the loaded version about a few validation examples; it must answer as the checkpoint does."""
        codec = oip_codec_for(candidate.learner.task)
        with failing_as("probe"):
            request = codec.encode_request(candidate.sample.x[:PROBE_EXAMPLES])
            expected = codec.answered_in_process(candidate.learner, request)
            served = codec.decode_response(self.client.infer(name, request))
        difference = max_abs_difference(expected, served)
        if not difference <= PROBE_TOLERANCE:
            raise PublishError(
                "probe",
                f"version {candidate.version} answered differently when served "
                f"(largest difference {difference:.3g} > {PROBE_TOLERANCE:g})",
            )

    def _unload_quietly(self, name: str) -> None:
        try:
            self.client.unload(name)
        except OipError as err:
            log.warning("could not unload a version that failed its probe", extra={"model": name, "error": str(err)})
