"""Publishing to TorchServe 0.12 through its management and inference REST APIs.

Each checkpoint version becomes a version of one TorchServe model: its archive is registered
synchronously (the workers are loaded when the call returns), probed through
``/predictions/<model>/<version>``, made the default with ``set-default`` (an atomic switch inside
TorchServe, so clients of ``/predictions/<model>`` see no gap), and old versions are drained and
unregistered, keeping ``serving.keep_versions`` besides the live one.

TorchServe reads the archive through a ``file://`` URL, so it must see the model store at the same
path as the daemon (one machine, or one shared volume mounted at the same place).
"""

from __future__ import annotations

import json
import logging
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

from alma_daemon.config import Config, ServingConfig
from alma_daemon.core.checkpoints import CheckpointStore
from alma_daemon.infra.unreachable import unreachable_line
from alma_daemon.logs import NOTICE
from alma_daemon.observability.progress import told_while
from serving.protocols.codecs import codec_for, max_abs_difference
from serving.protocols.torchserve_keys import TokenKeys, key_file_path
from serving.publishing.archiver import ARCHIVES, archive_name, build_archive, checkpoint_digest
from serving.publishing.publisher import Candidate, Publisher, PublishError, failing_as, guard_settings

log = logging.getLogger(__name__)

#: Largest difference allowed between served and in-process probabilities. Answers from the same
#: weights differ only by float rounding (TF32 on a GPU worker); a wrong model, version or
#: normalization differs by far more.
PROBE_TOLERANCE = 1e-3
#: Registration loads the workers before it returns; TorchServe's own startup timeout is 120 s.
REGISTER_TIMEOUT_SECONDS = 180.0
REQUEST_TIMEOUT_SECONDS = 30.0
#: A version is unregistered once its queue has stayed empty this long, so that requests a worker
#: has already taken from the queue (which ``pendingRequests`` does not count) can finish.
DRAIN_QUIET_SECONDS = 1.0
DRAIN_TIMEOUT_SECONDS = 60.0
DRAIN_POLL_SECONDS = 0.05


class TorchServeError(RuntimeError):
    """TorchServe answered an error status, or could not be reached (``status`` None)."""

    def __init__(self, method: str, url: str, status: int | None, detail: str):
        super().__init__(f"{method} {url} -> {status if status is not None else 'unreachable'}: {detail}")
        self.status = status


class TorchServeUnreachable(TorchServeError):
    """No answer from TorchServe: one line naming it, the URL key and the fix (infra/unreachable.py)."""

    def __init__(self, api: str, base_url: str, error: BaseException | str):
        RuntimeError.__init__(
            self, unreachable_line("torchserve" if api == "management" else "torchserve_inference", base_url, error)
        )
        self.status = None


class TorchServeClient:
    """The subset of TorchServe's REST APIs that publishing needs; errors raise TorchServeError."""

    def __init__(self, management_url: str, inference_url: str, keys: TokenKeys | None = None):
        self.management_url = management_url.rstrip("/")
        self.inference_url = inference_url.rstrip("/")
        self.keys = keys

    def register(self, model: str, archive_url: str, workers: int) -> None:
        query = urllib.parse.urlencode(
            {"url": archive_url, "model_name": model, "synchronous": "true", "initial_workers": workers}
        )
        self._call("POST", f"/models?{query}", timeout=REGISTER_TIMEOUT_SECONDS)

    def versions(self, model: str) -> dict[int, dict[str, Any]]:
        """Registered versions of ``model`` with their descriptions; empty if none."""
        try:
            described = self._call("GET", f"/models/{model}/all")
        except TorchServeError as err:
            if err.status == 404:
                return {}
            raise
        return {int(entry["modelVersion"]): entry for entry in described}

    def default_version(self, model: str) -> int | None:
        try:
            return int(self._call("GET", f"/models/{model}")[0]["modelVersion"])
        except TorchServeError as err:
            if err.status == 404:
                return None
            raise

    def set_default(self, model: str, version: int) -> None:
        self._call("PUT", f"/models/{model}/{version}/set-default")

    def unregister(self, model: str, version: int) -> None:
        self._call("DELETE", f"/models/{model}/{version}")

    def pending_requests(self, model: str, version: int) -> int:
        return int(self._call("GET", f"/models/{model}/{version}")[0]["jobQueueStatus"]["pendingRequests"])

    def predict(self, model: str, version: int | None, payload: dict[str, Any]) -> dict[str, Any]:
        path = f"/predictions/{model}" + (f"/{version}" if version is not None else "")
        return self._call("POST", path, api="inference", body=json.dumps(payload).encode())

    def _call(
        self,
        method: str,
        path: str,
        *,
        api: str = "management",
        body: bytes | None = None,
        timeout: float = REQUEST_TIMEOUT_SECONDS,
    ) -> Any:
        """The endpoint's JSON answer, decoded (an object or a list, as each endpoint documents)."""
        base = self.management_url if api == "management" else self.inference_url
        url = base + path
        for attempt in (1, 2):
            headers = {"Content-Type": "application/json"} if body is not None else {}
            if self.keys is not None:
                headers["Authorization"] = f"Bearer {self.keys.key(api)}"
            request = urllib.request.Request(url, data=body, headers=headers, method=method)
            try:
                with urllib.request.urlopen(request, timeout=timeout) as response:
                    return json.loads(response.read() or b"{}")
            except urllib.error.HTTPError as err:
                detail = err.read().decode(errors="replace")
                # TorchServe answers 400 InvalidKeyException for an expired key: renew it once.
                if attempt == 1 and self.keys is not None and err.code == 400 and "InvalidKeyException" in detail:
                    self._renew(api)
                    continue
                raise TorchServeError(method, url, err.code, _message(detail)) from None
            except (urllib.error.URLError, OSError) as err:
                raise TorchServeUnreachable(api, base, getattr(err, "reason", err)) from None
        raise AssertionError("unreachable: the second attempt returns or raises")

    def _renew(self, api: str) -> None:
        assert self.keys is not None  # _call renews a key only where keys are in use
        request = urllib.request.Request(
            f"{self.management_url}/token?type={api}", headers={"Authorization": f"Bearer {self.keys.key('API')}"}
        )
        try:
            with urllib.request.urlopen(request, timeout=REQUEST_TIMEOUT_SECONDS):
                log.info("renewed TorchServe key", extra={"api": api})
        except (urllib.error.URLError, OSError) as err:
            raise TorchServeError(
                "GET",
                f"{self.management_url}/token",
                getattr(err, "code", None),
                f"renewing the {api} key failed: {err}",
            ) from None


def _archive_file(registration: dict[str, Any]) -> str:
    """The file name of the archive a version was registered from: its ``modelUrl`` is the archive's
    ``file://`` URL, or its name in TorchServe's model store."""
    return Path(urllib.parse.urlparse(registration.get("modelUrl", "")).path).name


def _message(detail: str) -> str:
    try:
        return json.loads(detail).get("message", detail)
    except (json.JSONDecodeError, AttributeError):
        return detail.strip()


class TorchServePublisher(Publisher):
    """Hot-swaps checkpoint versions into a running TorchServe."""

    kind = "torchserve"

    @classmethod
    def from_config(cls, config: Config, store: CheckpointStore) -> TorchServePublisher:
        key_file = key_file_path(config)
        client = TorchServeClient(
            config.serving.management_url,
            config.serving.inference_url,
            TokenKeys(key_file) if key_file is not None else None,
        )
        return cls(store, config.serving, client, config.daemon.keep_checkpoints)

    def __init__(
        self,
        store: CheckpointStore,
        serving: ServingConfig,
        client: TorchServeClient,
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
        self.workers = serving.workers
        self.keep_versions = serving.keep_versions
        self.archive_dir = store.folder / ARCHIVES

    def ensure_serving(self, live: int) -> None:
        if live not in self.client.versions(self.model):
            log.warning("live version not registered; registering it again", extra={"version": live})
            self.stage(self.load_candidate(live))
        with failing_as("set_default"):
            if self.client.default_version(self.model) != live:
                self.client.set_default(self.model, live)

    def stage(self, candidate: Candidate) -> None:
        version = candidate.version
        with failing_as("archive"):
            archive = build_archive(self.store.path(version), self.model, version, self.archive_dir)
        with failing_as("register"):
            registrations = self.client.versions(self.model)
            registered = registrations.get(version)
            if registered is not None and _archive_file(registered) != archive.name:
                log.warning(
                    "version registered from a deleted checkpoint; registering the current one",
                    extra={"version": version, "registered": _archive_file(registered), "archive": archive.name},
                )
                self._unregister_stale(version, len(registrations))
                registered = None
            if registered is None:
                # Registration returns once the workers are loaded: tens of seconds on a busy host.
                with told_while(lambda seconds: self._tell_loading(version, seconds)):
                    self._register(archive)
        try:
            self._probe(candidate)
        except PublishError:
            self._unregister_quietly(version)
            raise

    def make_default(self, version: int) -> None:
        with failing_as("set_default"):
            self.client.set_default(self.model, version)

    def retire(self, live: int) -> None:
        with failing_as("delete"):
            others = sorted(v for v in self.client.versions(self.model) if v != live)
        kept = others[max(0, len(others) - self.keep_versions) :] if self.keep_versions else []
        for version in others:
            if version not in kept:
                self._drain(version)
                with failing_as("delete"):
                    self.client.unregister(self.model, version)
                log.info("unregistered", extra={"version": version})

    def served_versions(self) -> list[int]:
        """Registered versions that serve the checkpoint now in the model store under their number."""
        with failing_as("register"):
            registered = self.client.versions(self.model)
        stored = set(self.store.versions())
        served = []
        for version, entry in sorted(registered.items()):
            if version not in stored:
                continue
            try:
                digest = checkpoint_digest(self.store.path(version))
            except FileNotFoundError:
                continue  # deleted since it was listed (daemon.keep_checkpoints); `alma versions` reads unlocked
            if _archive_file(entry) == archive_name(self.model, version, digest):
                served.append(version)
        return served

    def _unregister_stale(self, version: int, registered: int) -> None:
        """Drain and unregister ``version``, registered from a checkpoint since deleted (see
        :func:`serving.publishing.live_pointer.withdraw`), one of ``registered`` versions.

        Every flow has made the live version the default already (``Publisher._serve_live``), so
        ``version`` is still the default only where no live version is left. TorchServe refuses to
        unregister its default while it holds other versions (403), which every retry would meet
        again: the error is the operator's to resolve, and is not retried.
        """
        if registered > 1 and self.client.default_version(self.model) == version:
            raise PublishError(
                "register",
                f"version {version} is TorchServe's default but was registered from a deleted checkpoint, "
                "and no other live version can be made the default first (TorchServe refuses to unregister "
                f"its default while it holds other versions): make another version of {self.model!r} the "
                "default through TorchServe's management API, or restart TorchServe",
                retry=False,
            )
        self._drain(version)
        self.client.unregister(self.model, version)

    def _tell_loading(self, version: int, seconds: float) -> None:
        log.log(
            NOTICE,
            f"TorchServe is loading the workers of version {version}: {seconds:.0f} s so far "
            f"(up to {REGISTER_TIMEOUT_SECONDS:g} s)",
            extra={"version": version, "workers": self.workers},
        )

    def _register(self, archive: Path) -> None:
        try:
            self.client.register(self.model, archive.resolve().as_uri(), self.workers)
        except TorchServeError as err:
            # TorchServe copies a registered archive into its model store and deletes the copy on
            # unregistering; a restart forgets the registration but keeps the copy, which it then
            # refuses to overwrite. The copy is the same immutable version: register it by name.
            if "already exists" not in str(err):
                raise
            self.client.register(self.model, archive.name, self.workers)

    def _probe(self, candidate: Candidate) -> None:
        """Ask the new version about a few validation examples; it must answer as the checkpoint does."""
        with failing_as("probe"):
            request, expected = candidate.probe()
            answer = self.client.predict(self.model, candidate.version, request)
            served = codec_for(candidate.learner.task).decode_json(answer)
        difference = max_abs_difference(expected, served)
        if not difference <= PROBE_TOLERANCE:
            raise PublishError(
                "probe",
                f"version {candidate.version} answered differently when served "
                f"(largest difference {difference:.3g} > {PROBE_TOLERANCE:g})",
            )

    def _drain(self, version: int) -> None:
        deadline = time.monotonic() + DRAIN_TIMEOUT_SECONDS
        quiet_since: float | None = None
        with failing_as("drain"):
            while True:
                now = time.monotonic()
                if self.client.pending_requests(self.model, version) > 0:
                    quiet_since = None
                elif quiet_since is None:
                    quiet_since = now
                elif now - quiet_since >= DRAIN_QUIET_SECONDS:
                    return
                if now > deadline:
                    raise PublishError(
                        "drain", f"version {version} still had queued requests after {DRAIN_TIMEOUT_SECONDS:.0f} s"
                    )
                time.sleep(DRAIN_POLL_SECONDS)

    def _unregister_quietly(self, version: int) -> None:
        try:
            self.client.unregister(self.model, version)
        except TorchServeError as err:
            log.warning(
                "could not unregister a version that failed its probe", extra={"version": version, "error": str(err)}
            )
