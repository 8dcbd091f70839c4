"""An ASGI middleware that closes the Open Inference Protocol's model repository to requests without
the token (:mod:`serving.protocols.repository_token`), and lets every other request through untouched.

KServe's model server (:mod:`serving.runtimes.kserve`) wears it. Closed: every path under
``/v2/repository`` (load, unload, the index), whatever the method; open: inference, health, metadata
and metrics. Plain ASGI rather than a framework's middleware class: it adds one comparison to an
inference request, and it does not need KServe or FastAPI to be tested.
"""

from __future__ import annotations

import hmac
import json
import re
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
App = Callable[[Scope, Receive, Send], Awaitable[None]]

#: The protocol's model repository extension; a path is compared once its runs of slashes are one.
REPOSITORY_PREFIX = "/v2/repository"


def is_repository_path(path: str) -> bool:
    """Whether ``path`` (decoded, as ASGI gives it) is under the model repository extension."""
    path = re.sub("/+", "/", path).rstrip("/")
    return path == REPOSITORY_PREFIX or path.startswith(REPOSITORY_PREFIX + "/")


class RepositoryGuard:
    """Answers 401 to a model repository request without ``Authorization: Bearer <token>``, 403 to one
    with another token; passes everything else to ``app``."""

    def __init__(self, app: App, token: str) -> None:
        if not token:
            raise ValueError("the repository token is empty")
        self.app = app
        self._expected = f"Bearer {token}".encode()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and is_repository_path(scope["path"]):
            status = self._refusal(scope)
            if status is not None:
                await _refuse(send, status)
                return
        await self.app(scope, receive, send)

    def _refusal(self, scope: Scope) -> int | None:
        """None where the request carries the token, else the status that refuses it."""
        sent = [value for name, value in scope["headers"] if name.lower() == b"authorization"]
        if not sent:
            return 401
        # In constant time: the answer must not tell how much of a guessed token was right.
        return None if len(sent) == 1 and hmac.compare_digest(sent[0], self._expected) else 403


async def _refuse(send: Send, status: int) -> None:
    reason = "no credentials" if status == 401 else "wrong credentials"
    body = json.dumps(
        {"error": f"the model repository needs the publisher's token ({reason}): Authorization: Bearer <token>"}
    ).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    if status == 401:
        headers.append((b"www-authenticate", b"Bearer"))
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})
