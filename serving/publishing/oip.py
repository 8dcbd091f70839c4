"""Publishing to a server of the Open Inference Protocol v2 (``serving.kind: kserve``).

Each checkpoint version is loaded under its own name, ``<model>-v<N>`` (:mod:`serving.protocols.version_names`),
through the protocol's model repository extension, probed through ``/v2/models/<model>-v<N>/infer``,
then made the default: the publisher records N in the model store's default file and asks the
server to load ``<model>``, the name clients call, which now serves N. KServe's model server as
``alma serve --kind kserve`` runs it (:mod:`serving.runtimes.kserve`) keeps the loaded version and
serves it under the second name: an atomic switch, no request fails. Old versions are unloaded,
keeping ``serving.keep_versions`` besides the live one; a request already running on one finishes
on it (the server frees a model once nothing holds it), so no drain is needed.

Every request is the protocol's, so the same publisher drives another OIP server whose model
repository maps the two kinds of name to checkpoints this way (MLServer: :mod:`serving.runtimes.mlserver`).
The repository requests carry the token of ``serving.repository_token_file`` where there is one
(:mod:`serving.protocols.repository_token`): KServe's model server as ``alma serve --kind kserve`` runs it refuses them
without it.
The server reads the checkpoints and the default file from the model store: it must see the files
the daemon writes (one machine, or one shared volume, at any path), as TorchServe must.

:class:`OipClient` asks only the protocol's own requests, so the same client drives KServe's model
server, MLServer and Triton (:mod:`serving.publishing.triton`): health (``/v2/health/live``), a
model's readiness (``/v2/models/{name}/ready``), inference (``/v2/models/{name}/infer``) and the model
repository extension (``/v2/repository/models/{name}/load`` and ``unload``, ``/v2/repository/index``).
KServe's server lacks the index; there the list of models (``GET /v2/models``) stands in for it. The
repository requests carry ``Authorization: Bearer <token>`` where the server wants a token; the others
carry none.
"""

from __future__ import annotations

import json
import logging
import urllib.error
import urllib.parse
import urllib.request
from typing import Any

from alma_daemon.config import Config, ServingConfig
from alma_daemon.core.checkpoints import CheckpointStore
from alma_daemon.infra.unreachable import unreachable_line
from alma_daemon.logs import NOTICE
from alma_daemon.observability.progress import told_while
from serving.protocols.codecs import codec_for, max_abs_difference
from serving.protocols.repository_token import RepositoryToken, check_token
from serving.protocols.version_names import read_default, version_of, versioned_name, write_default
from serving.publishing.publisher import PROBE_EXAMPLES, Candidate, Publisher, PublishError, failing_as, guard_settings
from serving.runtimes.bundled_model import bundle_module_source

log = logging.getLogger(__name__)

#: Largest difference allowed between served and in-process answers (as for TorchServe): the same
#: weights differ only by float rounding; a wrong model, version or normalization by far more.
PROBE_TOLERANCE = 1e-3
#: A load builds the model from its checkpoint: seconds for the paper's models, more for a large one on a busy host.
LOAD_TIMEOUT_SECONDS = 180.0
REQUEST_TIMEOUT_SECONDS = 30.0


class OipError(RuntimeError):
    """The server answered an error status, or could not be reached (``status`` None)."""

    def __init__(self, method: str, url: str, status: int | None, detail: str):
        super().__init__(f"{method} {url} -> {status if status is not None else 'unreachable'}: {detail}")
        self.status = status


class OipRefused(OipError):
    """The server refused a model repository request for want of credentials (401 or 403)."""


class OipUnreachable(OipError):
    """No answer from the server: one line naming it, the URL key and the fix (infra/unreachable.py)."""

    def __init__(self, base_url: str, error: BaseException | str):
        RuntimeError.__init__(self, unreachable_line("oip", base_url, error))
        self.status = None


class OipClient:
    """The protocol's requests to one server at ``base_url``; errors raise :class:`OipError`."""

    def __init__(self, base_url: str, token: RepositoryToken | None = None):
        self.base_url = base_url.rstrip("/")
        #: Sent with the repository requests (load, unload, index); None: no credentials.
        self.token = token
        #: Whether the server answers the repository index (None: not asked yet); KServe's does not.
        self._has_index: bool | None = None

    def live(self) -> bool:
        try:
            self._call("GET", "/v2/health/live")
        except OipError:
            return False
        return True

    def model_ready(self, name: str) -> bool:
        """Whether ``name`` is loaded and ready (False where the server does not know it)."""
        try:
            self._call("GET", f"/v2/models/{_quoted(name)}/ready")
        except OipError as err:
            if err.status in (400, 404, 503):
                return False
            raise
        return True

    def load(self, name: str) -> None:
        """Load (or load again) ``name`` from the server's model repository; returns once it is ready."""
        self._repository_call(f"/v2/repository/models/{_quoted(name)}/load", timeout=LOAD_TIMEOUT_SECONDS)

    def unload(self, name: str) -> None:
        self._repository_call(f"/v2/repository/models/{_quoted(name)}/unload")

    def models(self) -> list[str]:
        """The names of the models the server has loaded."""
        if self._has_index is not False:
            try:
                # Triton's index lists every folder of its repository, loaded or not, unless asked for
                # the ready ones; MLServer honours the flag too.
                index = self._repository_call("/v2/repository/index", body=b'{"ready": true}')
                self._has_index = True
                return [entry["name"] for entry in index]
            except OipError as err:
                if err.status not in (404, 405):
                    raise
                self._has_index = False
        return list(self._call("GET", "/v2/models")["models"])

    def infer(self, name: str, request: dict[str, Any]) -> dict[str, Any]:
        return self._call("POST", f"/v2/models/{_quoted(name)}/infer", body=json.dumps(request).encode())

    def _repository_call(self, path: str, *, body: bytes = b"{}", timeout: float = REQUEST_TIMEOUT_SECONDS) -> Any:
        """A POST of the model repository extension, with the token where there is one."""
        token = self.token.value() if self.token is not None else None
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        try:
            return self._call("POST", path, body=body, timeout=timeout, headers=headers)
        except OipError as err:
            if err.status not in (401, 403) or self.token is None:
                raise
            refused = OipRefused("POST", self.base_url + path, err.status, self.token.refused_hint())
            raise refused from None

    def _call(
        self,
        method: str,
        path: str,
        *,
        body: bytes | None = None,
        timeout: float = REQUEST_TIMEOUT_SECONDS,
        headers: dict[str, str] | None = None,
    ) -> Any:
        url = self.base_url + path
        headers = {**({"Content-Type": "application/json"} if body is not None else {}), **(headers or {})}
        request = urllib.request.Request(url, data=body, headers=headers, method=method)
        try:
            with urllib.request.urlopen(request, timeout=timeout) as response:
                return json.loads(response.read() or b"{}")
        except urllib.error.HTTPError as err:
            raise OipError(method, url, err.code, _message(err.read().decode(errors="replace"))) from None
        except (urllib.error.URLError, OSError) as err:
            raise OipUnreachable(self.base_url, getattr(err, "reason", err)) from None


def _quoted(name: str) -> str:
    return urllib.parse.quote(name, safe="")


def _message(detail: str) -> str:
    """The server's error text: KServe and MLServer answer ``{"error": ...}``, Triton too."""
    try:
        decoded = json.loads(detail)
    except json.JSONDecodeError:
        return detail.strip()
    return str(decoded.get("error", decoded.get("detail", detail))) if isinstance(decoded, dict) else detail.strip()


class OipPublisher(Publisher):
    """Hot-swaps checkpoint versions into a running Open Inference Protocol server."""

    kind = "kserve"

    @classmethod
    def from_config(cls, config: Config, store: CheckpointStore) -> OipPublisher:
        check_token(config)  # a token file that cannot be read: one line at the start, not at the first swap
        client = OipClient(config.serving.inference_url, RepositoryToken.for_config(config))
        return cls(store, config.serving, client, config.daemon.keep_checkpoints)

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
        # number (serving/publishing/live_pointer.py) has other weights, and a load is cheap.
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
        codec = codec_for(candidate.learner.task)
        with failing_as("probe"):
            request = codec.encode_oip(candidate.sample.x[:PROBE_EXAMPLES])
            expected = codec.answer_oip_in_process(candidate.learner, request)
            served = codec.decode_oip(self.client.infer(name, request))
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
