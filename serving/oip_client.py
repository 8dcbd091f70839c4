"""A client of the Open Inference Protocol v2 over REST: what publishing asks of any OIP server.

Only the protocol's own requests, so the same client drives KServe's model server, MLServer and
Triton: health (``/v2/health/live``), a model's readiness (``/v2/models/{name}/ready``), inference
(``/v2/models/{name}/infer``) and the model repository extension (``/v2/repository/models/{name}/load``
and ``unload``, ``/v2/repository/index``). KServe's server lacks the index; there the list of models
(``GET /v2/models``) stands in for it.

The repository requests carry ``Authorization: Bearer <token>`` where the server wants a token (KServe's
model server as ``alma serve --kind kserve`` runs it: :mod:`serving.oip_token`); the others carry none.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.parse
import urllib.request
from typing import TYPE_CHECKING, Any

from alma_daemon.infra.unreachable import unreachable_line

if TYPE_CHECKING:
    from serving.oip_token import RepositoryToken

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

    def infer(self, name: str, request: dict) -> dict:
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
