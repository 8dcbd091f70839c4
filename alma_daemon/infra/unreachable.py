"""One line for a server that cannot be reached: which server, where, the config key that points at
it, why, and the fix.

Every connection failure a user meets goes through :func:`unreachable_line`, at start-up (raised as
:class:`ServerUnreachable`, which the CLI prints as ``alma <command>: error: <line>``) and at run
time (the daemon's outage warnings, which add how long it waits: :func:`outage_line`). The servers
and their keys and fixes are kept in one table, :data:`SERVER_KINDS`.
"""

from __future__ import annotations

from dataclasses import dataclass

from alma_daemon.logs import ExplainedError, error_text


@dataclass(frozen=True)
class ServerKind:
    """A server the daemon or a command connects to (or, for the exporter, listens as)."""

    #: How messages name it, capitalised at the start of a line.
    name: str
    #: The config key that says where it is.
    key: str
    #: What to do about it, as an imperative clause.
    fix: str


#: Each server by the name the outage board, ``alma status`` and ``alma_server_up`` use.
SERVER_KINDS: dict[str, ServerKind] = {
    "redis": ServerKind(
        "Redis",
        "redis.url",
        "start Redis there (`alma dev up` starts one), set redis.url to a running one, "
        "or use --embedded (no servers needed)",
    ),
    "kafka": ServerKind(
        "Kafka broker",
        "kafka.bootstrap_servers",
        "start a broker there (`alma dev up` starts one), set kafka.bootstrap_servers to a running one, "
        "or use --embedded / kafka.transport: redis",
    ),
    "torchserve": ServerKind(
        "TorchServe",
        "serving.management_url",
        "start it with `alma serve` (same --config), set serving.management_url and serving.inference_url "
        "to a running one, or serve in process with serving.kind: local",
    ),
    "torchserve_inference": ServerKind(
        "TorchServe",
        "serving.inference_url",
        "start it with `alma serve` (same --config), set serving.inference_url and serving.management_url "
        "to a running one, or serve in process with serving.kind: local",
    ),
    "oip": ServerKind(
        "Model server",
        "serving.inference_url",
        "start one with `alma serve` (same --config: it starts the server serving.kind names), set serving.inference_url to a running "
        "Open Inference Protocol server (KServe, MLServer, Triton), or serve in process with serving.kind: local",
    ),
    "metrics": ServerKind(
        "Metrics exporter",
        "metrics.port",
        "stop what listens there (another daemon?), or choose another metrics.port (0 turns the exporter off)",
    ),
}


class ServerUnreachable(ExplainedError):
    """A server could not be reached (or, for the exporter, its port not taken); the message is one
    line naming the server, its config key and the fix."""

    def __init__(self, kind: str, address: str, error: BaseException | str):
        super().__init__(unreachable_line(kind, address, error))
        self.kind = kind
        self.address = address
        self.reason = reason_of(error)


def reason_of(error: BaseException | str) -> str:
    """Why a connection failed, in a few words: the operating system's reason (``connection
    refused``, ``name or service not known``, ``timed out``) where one is behind ``error``, else the
    error's own text on one line."""
    if isinstance(error, str):
        return " ".join(error.split())
    seen: set[int] = set()
    cause: BaseException | None = error
    while cause is not None and id(cause) not in seen:
        seen.add(id(cause))
        if isinstance(cause, TimeoutError):  # socket.timeout too
            return "timed out"
        if isinstance(cause, OSError) and cause.strerror:
            return cause.strerror[0].lower() + cause.strerror[1:].rstrip(".")
        cause = cause.__cause__ or cause.__context__
    return " ".join(error_text(error).split())[:300]


def where(kind: str, address: str) -> str:
    """``Redis at 127.0.0.1:6379 (redis.url)``; ``Redis (redis.url)`` where the address is not known."""
    server = SERVER_KINDS[kind]
    return f"{server.name} at {address} ({server.key})" if address else f"{server.name} ({server.key})"


def unreachable_line(kind: str, address: str, error: BaseException | str) -> str:
    """``Redis at 127.0.0.1:16380 (redis.url) cannot be reached: connection refused; start Redis ...``."""
    verb = "cannot listen" if kind == "metrics" else "cannot be reached"
    return f"{where(kind, address)} {verb}: {reason_of(error)}; {SERVER_KINDS[kind].fix}"


def outage_line(kind: str, address: str, error: BaseException | str, limit_seconds: float) -> str:
    """The daemon's warning when a server it depends on goes away: what it waits for and how long.

    ``Kafka broker at 127.0.0.1:9092 (kafka.bootstrap_servers) cannot be reached: connection refused;
    the daemon waits for it for up to 300 s (daemon.outage_limit_seconds), then exits; start a
    broker there ...``
    """
    return (
        f"{where(kind, address)} cannot be reached: {reason_of(error)}; the daemon waits for it for up to "
        f"{limit_seconds:g} s (daemon.outage_limit_seconds), then exits; {SERVER_KINDS[kind].fix}"
    )


def gave_up_line(kind: str, address: str, reason: str, seconds: float, limit_seconds: float) -> str:
    """The daemon's last line when an outage outlasted ``daemon.outage_limit_seconds``."""
    return (
        f"{where(kind, address)} unreachable for {seconds:.0f} s, longer than daemon.outage_limit_seconds "
        f"({limit_seconds:g} s): the daemon gives up; last error: {reason}; {SERVER_KINDS[kind].fix}"
    )
