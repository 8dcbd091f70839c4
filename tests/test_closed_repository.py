"""KServe's model server as ``alma serve --kind kserve`` runs it lets no one in: its model repository
(load, unload, index) answers only the publisher's token, it listens on loopback unless told otherwise,
it starts at normal priority and yields the cores once it serves, and bad input at its start is one line
naming the key and the fix (serving/protocols/repository_token.py, serving/runtimes/repository_guard.py,
alma_daemon/local_servers/kserve.py).

The integration tests run real servers on loopback (the ``kserve_server`` fixture, ``alma serve``);
the others need none.
"""

from __future__ import annotations

import asyncio
import importlib.util
import json
import os
import socket
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from alma_daemon.cli import main
from alma_daemon.config import ConfigError, build_config
from alma_daemon.data.datasets import MNIST_TASK
from alma_daemon.local_servers.processes import ServerProcess, ServerStartError
from serving.protocols.codecs import codec_for
from serving.protocols.repository_token import KEY, RepositoryToken, read_token, write_token
from serving.publishing import make_publisher
from serving.publishing.oip import OipClient, OipPublisher, OipRefused
from serving.runtimes.repository_guard import RepositoryGuard, is_repository_path
from tests.helpers.servers import free_port, http_request
from tests.helpers.serving import save_version

MODEL = "alma"
REPOSITORY_REQUESTS = [
    ("unload the live name", f"/v2/repository/models/{MODEL}/unload"),
    ("unload the live version", f"/v2/repository/models/{MODEL}-v1/unload"),
    ("load another version", f"/v2/repository/models/{MODEL}-v2/load"),
    ("load the live name", f"/v2/repository/models/{MODEL}/load"),
    ("index", "/v2/repository/index"),
    ("doubled slashes", f"//v2//repository/models/{MODEL}/unload"),
    ("a trailing slash", f"/v2/repository/models/{MODEL}/unload/"),
]


# -- the guard, without a server ------------------------------------------------------------------


def asgi_call(guard: RepositoryGuard, path: str, headers: list[tuple[bytes, bytes]]) -> tuple[int, dict]:
    """One HTTP request through ``guard`` in front of an app that answers 200 ``{"app": true}``."""
    sent: list[dict] = []

    async def send(message: dict) -> None:
        sent.append(message)

    async def receive() -> dict:
        return {"type": "http.request", "body": b"{}"}

    scope = {"type": "http", "method": "POST", "path": path, "headers": headers}
    asyncio.run(guard(scope, receive, send))
    body = b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body")
    return sent[0]["status"], json.loads(body)


async def app_answers(scope, receive, send) -> None:
    await send({"type": "http.response.start", "status": 200, "headers": []})
    await send({"type": "http.response.body", "body": b'{"app": true}'})


def test_the_guard_refuses_every_repository_path_without_the_token_and_lets_the_rest_through():
    guard = RepositoryGuard(app_answers, "s3cret")
    for what, path in REPOSITORY_REQUESTS:
        assert asgi_call(guard, path, [])[0] == 401, what
        assert asgi_call(guard, path, [(b"authorization", b"Bearer wrong")])[0] == 403, what
        assert asgi_call(guard, path, [(b"Authorization", b"Bearer s3cret")]) == (200, {"app": True}), what
    # Two Authorization headers, one of them right, are not the token.
    twice = [(b"authorization", b"Bearer s3cret"), (b"authorization", b"Bearer wrong")]
    assert asgi_call(guard, "/v2/repository/index", twice)[0] == 403
    for path in ("/v2/health/live", f"/v2/models/{MODEL}/infer", f"/v2/models/{MODEL}/ready", "/metrics", "/v2"):
        assert asgi_call(guard, path, []) == (200, {"app": True}), path
    status, answer = asgi_call(guard, "/v2/repository/index", [])
    assert "Authorization: Bearer <token>" in answer["error"]


def test_repository_paths_are_the_extension_s_only():
    assert is_repository_path("/v2/repository") and is_repository_path("/v2/repository/index")
    assert not is_repository_path("/v2/repositoryx") and not is_repository_path("/v2/models/repository/infer")


# -- the token file ---------------------------------------------------------------------------------


def test_the_token_alma_serve_writes_is_private_random_and_kept(tmp_path):
    path = tmp_path / "state" / "kserve" / "repository_token"
    write_token(path)
    token = read_token(path)
    assert len(token) >= 40 and (path.stat().st_mode & 0o777) == 0o600
    write_token(path)  # a second start keeps it: a running daemon's stays valid
    assert read_token(path) == token
    write_token(other := tmp_path / "other")
    assert read_token(other) != token


def test_a_token_file_missing_unreadable_or_empty_is_one_line_naming_the_key_and_the_fix(tmp_path):
    with pytest.raises(ConfigError) as missing:
        read_token(tmp_path / "nope")
    assert str(missing.value).startswith(f"{KEY}: {tmp_path / 'nope'} does not exist: create it (")
    with pytest.raises(ConfigError, match="start the server with `alma serve --kind kserve`"):
        read_token(tmp_path / "nope", named=False)
    with pytest.raises(ConfigError) as unreadable:
        read_token(tmp_path)  # a folder: unreadable as a file, even for root
    assert str(unreadable.value).startswith(f"{KEY}: cannot read {tmp_path} (") and "run as the user" in str(
        unreadable.value
    )
    (empty := tmp_path / "empty").write_text("\n")
    with pytest.raises(ConfigError, match=rf"^{KEY}: .* holds no token"):
        read_token(empty)
    for error in (missing, unreadable):
        assert "\n" not in str(error.value)


def kserve_settings(tmp_path: Path, **serving) -> dict:
    return {
        "daemon": {"state_dir": str(tmp_path / "state"), "checkpoint_dir": str(tmp_path / "ms")},
        "serving": {"kind": "kserve", "inference_url": f"http://127.0.0.1:{free_port()}", **serving},
    }


def test_the_daemon_refuses_to_start_with_a_named_token_file_it_cannot_read(tmp_path, capsys):
    missing = tmp_path / "secrets" / "token"
    with pytest.raises(ConfigError, match=rf"^{KEY}: {missing} does not exist"):
        make_publisher(build_config(kserve_settings(tmp_path, repository_token_file=str(missing))))
    # The default file may be missing (the server is not started yet, or wants no token) ...
    assert isinstance(make_publisher(build_config(kserve_settings(tmp_path))), OipPublisher)
    # ... but not unreadable.
    (tmp_path / "state" / "kserve" / "repository_token").mkdir(parents=True)
    with pytest.raises(ConfigError, match=rf"^{KEY}: cannot read "):
        make_publisher(build_config(kserve_settings(tmp_path)))
    # Through a command: one line.
    args = ["--set", f"daemon.checkpoint_dir={tmp_path / 'ms'}", "--set", "serving.kind=kserve"]
    assert main(["versions", *args, "--set", f"serving.repository_token_file={missing}"]) == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert line.startswith(f"alma versions: config error: {KEY}: {missing} does not exist: create it (")


class RecordingHandler(BaseHTTPRequestHandler):
    """Answers every request with ``status`` and records its path and Authorization header."""

    status = 200
    seen: list[tuple[str, str | None]] = []

    def answer(self) -> None:
        self.seen.append((self.path, self.headers.get("Authorization")))
        length = int(self.headers.get("Content-Length") or 0)
        self.rfile.read(length)
        body = b'{"models": [], "ready": true}' if self.status == 200 else b'{"error": "no"}'
        if self.path == "/v2/repository/index" and self.status == 200:
            body = b"[]"
        self.send_response(self.status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    do_GET = do_POST = answer

    def log_message(self, *args) -> None:
        pass


@pytest.fixture
def recording_server():
    RecordingHandler.seen, RecordingHandler.status = [], 200
    server = ThreadingHTTPServer(("127.0.0.1", 0), RecordingHandler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def test_the_publisher_sends_the_token_with_repository_requests_only(tmp_path, recording_server):
    (path := tmp_path / "token").write_text("s3cret\n")
    client = OipClient(recording_server, RepositoryToken(path, named=True))
    client.load(f"{MODEL}-v1")
    client.unload(f"{MODEL}-v1")
    client.models()
    client.model_ready(MODEL)
    client.infer(MODEL, {"inputs": []})
    assert RecordingHandler.seen == [
        (f"/v2/repository/models/{MODEL}-v1/load", "Bearer s3cret"),
        (f"/v2/repository/models/{MODEL}-v1/unload", "Bearer s3cret"),
        ("/v2/repository/index", "Bearer s3cret"),
        (f"/v2/models/{MODEL}/ready", None),
        (f"/v2/models/{MODEL}/infer", None),
    ]
    # No default file: no token, for a server that wants none (MLServer, Triton).
    RecordingHandler.seen.clear()
    OipClient(recording_server, RepositoryToken(tmp_path / "absent", named=False)).load(MODEL)
    assert RecordingHandler.seen == [(f"/v2/repository/models/{MODEL}/load", None)]


def test_a_refused_repository_request_says_which_key_holds_the_token(tmp_path, recording_server):
    RecordingHandler.status = 401
    client = OipClient(recording_server, RepositoryToken(tmp_path / "repository_token", named=False))
    with pytest.raises(OipRefused) as refused:
        client.unload(MODEL)
    assert refused.value.status == 401
    assert f"{KEY} ({tmp_path / 'repository_token'}, not there)" in str(refused.value)


# -- alma serve's bad input: one line, before anything starts ---------------------------------------


def serve_args(tmp_path: Path, *settings: str, kind: str = "kserve") -> list[str]:
    args = ["serve", "--kind", kind, "--set", f"serving.kind={kind}", "--set", f"daemon.state_dir={tmp_path / 'state'}"]
    args += ["--set", f"daemon.checkpoint_dir={tmp_path / 'ms'}"]
    for setting in settings:
        args += ["--set", setting]
    return args


def one_error_line(capsys) -> str:
    (line,) = capsys.readouterr().err.strip().splitlines()
    return line


@pytest.fixture
def kserve_installed(monkeypatch):
    """The checks that run before the server's start, wherever KServe is installed or not."""
    monkeypatch.setattr("alma_daemon.local_servers.kserve.require_kserve", lambda: None)


def test_alma_serve_with_a_named_token_file_that_is_missing_or_unreadable_is_one_line(
    tmp_path, capsys, kserve_installed
):
    url = f"serving.inference_url=http://127.0.0.1:{free_port()}"
    missing = tmp_path / "secrets" / "token"
    assert main(serve_args(tmp_path, url, f"{KEY}={missing}")) == 2
    assert one_error_line(capsys).startswith(f"alma serve: config error: {KEY}: {missing} does not exist: create it")
    assert not missing.exists(), "a named file is someone's secret: alma serve never writes it"
    assert main(serve_args(tmp_path, url, f"{KEY}={tmp_path}")) == 2
    assert one_error_line(capsys).startswith(f"alma serve: config error: {KEY}: cannot read {tmp_path} (")
    assert not (tmp_path / "state" / "kserve" / "kserve.pid").exists()


def test_alma_serve_on_an_address_it_cannot_listen_on_is_one_line(tmp_path, capsys, kserve_installed):
    port = free_port()
    # TEST-NET-3 (RFC 5737): an address no interface of this machine has.
    assert (
        main(serve_args(tmp_path, f"serving.inference_url=http://127.0.0.1:{port}", "serving.bind_host=203.0.113.7"))
        == 2
    )
    line = one_error_line(capsys)
    assert line.startswith(f"alma serve: config error: serving.bind_host: cannot listen on 203.0.113.7:{port} (")
    assert line.endswith(
        "set serving.bind_host to 127.0.0.1 (this machine only) or 0.0.0.0 (every interface, in a container)"
    )
    assert main(serve_args(tmp_path, f"serving.inference_url=http://no-such-host.invalid:{port}")) == 2
    assert one_error_line(capsys).startswith(
        "alma serve: config error: serving.inference_url: 'no-such-host.invalid' is not an address of this machine"
    )
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        busy = taken.getsockname()[1]
        assert main(serve_args(tmp_path, f"serving.inference_url=http://127.0.0.1:{busy}")) == 2
    assert one_error_line(capsys) == (
        f"alma serve: config error: serving.inference_url: port {busy} of 127.0.0.1 is taken by another process: "
        "stop it, or choose a free port in serving.inference_url"
    )


def test_alma_serve_of_a_server_that_is_not_installed_is_one_line(tmp_path, capsys, monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name in ("kserve", "ts") else real(name, *a)
    )
    assert main(serve_args(tmp_path)) == 1
    assert one_error_line(capsys) == (
        "alma serve: error: --kind kserve (serving.kind): KServe's model server is not installed here: "
        "pip install 'alma-daemon[kserve]' (kserve==0.21.0), or start TorchServe with --kind torchserve"
    )
    assert main(serve_args(tmp_path, kind="torchserve")) == 1
    assert one_error_line(capsys).startswith(
        "alma serve: error: --kind torchserve (serving.kind): TorchServe is not installed here: pip install"
    )


# -- a start that waits on the server's progress, not a fixed budget ---------------------------------


class Idle(ServerProcess):
    """A 'server' that never answers and uses no CPU: stuck."""

    name = "idle"
    stall_timeout = 1.5
    start_timeout = 60.0

    def command(self) -> list[str]:
        return ["sleep", "60"]

    def wait_ready(self, deadline: float) -> None:
        self.wait_until(lambda: False, "answering", deadline)


def test_a_start_that_uses_no_cpu_fails_as_stuck_long_before_the_cap(tmp_path):
    began = time.monotonic()
    with pytest.raises(ServerStartError, match=r"^idle used no CPU for 2 s before answering: stuck"):
        Idle(tmp_path, []).start()
    assert time.monotonic() - began < 10


def test_lowering_its_own_priority_lowers_every_thread_of_the_server(tmp_path):
    script = """
import os, threading, time
from pathlib import Path
from alma_daemon.infra.priority import lower_own_priority
stop = threading.Event()
threads = [threading.Thread(target=stop.wait) for _ in range(3)]
for t in threads: t.start()
lower_own_priority(7)
late = threading.Thread(target=stop.wait); late.start()
nices = [int(p.read_text().rsplit(")", 1)[1].split()[16]) for p in Path("/proc/self/task").glob("*/stat")]
stop.set()
print(nices)
"""
    nices = json.loads(
        subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True).stdout
    )
    assert nices == [7] * 5, "the main thread, three started before and one after"


# -- a real server --------------------------------------------------------------------------------


def infer(url: str, x, name: str = MODEL) -> tuple[int, dict]:
    codec = codec_for(MNIST_TASK)
    status, body = http_request(
        "POST",
        f"{url}/v2/models/{name}/infer",
        json.dumps(codec.encode_oip(x)).encode(),
        {"Content-Type": "application/json"},
    )
    return status, json.loads(body)


@pytest.mark.integration
def test_unauthenticated_unload_load_and_index_are_refused_and_the_live_version_keeps_answering(
    kserve_server, tmp_path, good_and_bad
):
    good, bad, sample = good_and_bad
    store_root = tmp_path / "model_store"
    server = kserve_server(store_root, MODEL)
    settings = {"kind": "kserve", "model_name": MODEL, "promotion_margin": 1.0, **server.publisher_settings()}
    publisher = make_publisher(build_config({"daemon": {"checkpoint_dir": str(store_root)}, "serving": settings}))
    assert isinstance(publisher, OipPublisher)
    save_version(publisher.store, 1, good, sample)
    save_version(publisher.store, 2, bad, sample)
    assert publisher.publish(1).action == "promoted"

    for what, path in REPOSITORY_REQUESTS:
        status, _ = http_request("POST", server.inference_url + path, b"{}", {"Content-Type": "application/json"})
        assert status == 401, what
        wrong = {"Content-Type": "application/json", "Authorization": "Bearer not-the-token"}
        assert http_request("POST", server.inference_url + path, b"{}", wrong)[0] == 403, what
    # Nothing changed: the live version answers, under its name and the clients'.
    for name in (MODEL, f"{MODEL}-v1"):
        status, answer = infer(server.inference_url, sample.x[:4], name)
        assert (status, answer["model_version"]) == (200, "1"), answer
    assert http_request("GET", f"{server.inference_url}/v2/models/{MODEL}-v2/ready")[0] != 200
    assert http_request("GET", f"{server.inference_url}/v2/health/live")[0] == 200
    # The publisher, with the token, still swaps.
    assert publisher.publish(2).action == "promoted"
    status, answer = infer(server.inference_url, sample.x[:4])
    assert (status, answer["model_version"]) == (200, "2")
    assert publisher.served_versions() == [1, 2]


def listening_hosts(port: int) -> set[str]:
    """The IPv4 addresses that sockets listen on at ``port`` (from /proc/net/tcp)."""
    hosts = set()
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        fields = line.split()
        address, hex_port = fields[1].split(":")
        if fields[3] == "0A" and int(hex_port, 16) == port:
            hosts.add(socket.inet_ntoa(bytes.fromhex(address)[::-1]))
    return hosts


def thread_nices(pid: int) -> set[int]:
    return {int(p.read_text().rsplit(")", 1)[1].split()[16]) for p in Path(f"/proc/{pid}/task").glob("*/stat")}


def wait_for(condition, seconds: float = 30.0) -> bool:
    deadline = time.monotonic() + seconds
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.1)
    return True


@pytest.mark.integration
@pytest.mark.slow
def test_alma_serve_listens_on_loopback_writes_a_private_token_and_yields_once_it_serves(
    tmp_path, good_and_bad, capsys
):
    pytest.importorskip("kserve", reason="KServe's model server is not installed: pip install 'alma-daemon[kserve]'")
    good, _, sample = good_and_bad
    port = free_port()
    settings = [f"serving.inference_url=http://127.0.0.1:{port}", "serving.niceness=12"]
    token = tmp_path / "state" / "kserve" / "repository_token"
    pid_file = tmp_path / "state" / "kserve" / "kserve.pid"
    assert main(serve_args(tmp_path, *settings)) == 0
    try:
        printed = capsys.readouterr().out
        assert f"listens on  127.0.0.1:{port}" in printed and f"token       {token} ({KEY})" in printed
        assert listening_hosts(port) == {"127.0.0.1"}
        assert (token.stat().st_mode & 0o777) == 0o600
        pid = int(pid_file.read_text())
        assert thread_nices(pid) == {0}, "normal priority until it serves"
        # The daemon, from the same config, finds the token where alma serve wrote it.
        config = build_config(
            {"daemon": {"state_dir": str(tmp_path / "state"), "checkpoint_dir": str(tmp_path / "ms")}},
            ["serving.kind=kserve", *settings],
        )
        publisher = make_publisher(config)
        assert isinstance(publisher, OipPublisher)
        save_version(publisher.store, 1, good, sample)
        assert publisher.publish(1).action == "promoted"
        assert thread_nices(pid) == {12}, "it yields the cores once it serves"
    finally:
        assert main([*serve_args(tmp_path, *settings), "--stop"]) == 0
    # Started again, on every interface (a container's setting): it serves the recorded version from
    # its start, and yields once it listens.
    everywhere = [*settings, "serving.bind_host=0.0.0.0"]
    assert main(serve_args(tmp_path, *everywhere)) == 0
    try:
        assert listening_hosts(port) == {"0.0.0.0"}
        pid = int(pid_file.read_text())
        assert wait_for(lambda: thread_nices(pid) == {12}), thread_nices(pid)
        status, answer = infer(f"http://127.0.0.1:{port}", sample.x[:4])
        assert (status, answer["model_version"]) == (200, "1")
    finally:
        assert main([*serve_args(tmp_path, *everywhere), "--stop"]) == 0
    assert not os.path.exists(pid_file)
