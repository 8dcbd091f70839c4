"""Servers run as process groups: free loopback ports, readiness, stopping a whole group.

:class:`ServerProcess` is what every server of this package is (alma_daemon/local_servers/__init__.py):
one process group (``start_new_session=True``) with its output in ``<workdir>/<name>.log``, started
on ports it may choose again when another process takes one first, killed, whole group, when the
interpreter exits unless it was started with :meth:`ServerProcess.start_detached`, which leaves it
running to be stopped later by its pid (:func:`stop_group`).
"""

from __future__ import annotations

import atexit
import os
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Sequence
from pathlib import Path

from alma_daemon.infra.priority import set_session_niceness
from alma_daemon.logs import ExplainedError

LOOPBACK = "127.0.0.1"

# Servers still running when the interpreter exits (a crash or an interrupt during a test's
# teardown) are killed here, so no broker or JVM outlives the process that started it; detached
# servers (alma dev up) are not in it.
_LIVE: set[ServerProcess] = set()


@atexit.register
def _kill_leftovers() -> None:
    for server in list(_LIVE):
        server.kill()


class ServerStartError(RuntimeError):
    """A server exited or did not become ready in time; the message carries its log tail."""


class ServerNotInstalled(ExplainedError):
    """A server ``alma serve`` was asked for is not installed: one line naming the option and what to install."""


class PortTakenError(ServerStartError):
    """Another process holds one of a server's ports: before its start, or taken while it started."""


def free_port() -> int:
    """Return a TCP port on 127.0.0.1 that nothing listens on right now (see :func:`free_ports`)."""
    return free_ports(1)[0]


def free_ports(count: int) -> list[int]:
    """Return ``count`` distinct free loopback ports.

    The sockets are held open together so the kernel cannot hand out the same port twice. They are
    closed on return, so another process may take a port before the server binds it: a race that
    :meth:`ServerProcess.start` handles for the ports a server chose itself (it starts again on
    fresh ones). A caller that passes the port to something else (the daemon's metrics port) takes
    that small risk.
    """
    sockets = []
    try:
        for _ in range(count):
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            sock.bind((LOOPBACK, 0))
            sockets.append(sock)
        return [sock.getsockname()[1] for sock in sockets]
    finally:
        for sock in sockets:
            sock.close()


def port_open(port: int) -> bool:
    try:
        with socket.create_connection((LOOPBACK, port), timeout=0.2):
            return True
    except OSError:
        return False


def port_bindable(port: int) -> bool:
    """Whether a listener could bind 127.0.0.1:``port`` now. With ``SO_REUSEADDR``, as servers set it,
    so the TIME_WAIT connections a stopped server leaves do not count, only a socket that holds it."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((LOOPBACK, port))
        except OSError:
            return False
        return True


def listening_inodes(port: int) -> set[int] | None:
    """Inodes of the sockets that listen on TCP ``port`` (IPv4 and IPv6), or None where ``/proc`` does not say."""
    inodes: set[int] = set()
    found = False
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        found = True
        for line in lines:
            fields = line.split()
            # local_address is ADDR:PORT in hex; state 0A is LISTEN.
            if len(fields) > 9 and fields[3] == "0A" and int(fields[1].rsplit(":", 1)[1], 16) == port:
                inodes.add(int(fields[9]))
    return inodes if found else None


def socket_inodes(pids: Sequence[int]) -> set[int]:
    """Inodes of the sockets that processes ``pids`` hold open."""
    inodes = set()
    for pid in pids:
        try:
            fds = list(Path(f"/proc/{pid}/fd").iterdir())
        except OSError:
            continue
        for fd in fds:
            try:
                target = os.readlink(fd)
            except OSError:
                continue
            if target.startswith("socket:["):
                inodes.add(int(target[8:-1]))
    return inodes


def log_tail(path: Path, lines: int = 40) -> str:
    try:
        text = path.read_text(errors="replace")
    except FileNotFoundError:
        return "(no log written)"
    return "\n".join(text.splitlines()[-lines:])


def http_request(
    method: str,
    url: str,
    data: bytes | None = None,
    headers: dict[str, str] | None = None,
    timeout: float = 60.0,
) -> tuple[int, bytes]:
    """Return (status, body) for any HTTP status instead of raising on 4xx/5xx."""
    request = urllib.request.Request(url, data=data, headers=headers or {}, method=method)
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as err:
        return err.code, err.read()


def http_ok(url: str) -> bool:
    try:
        return http_request("GET", url, timeout=2)[0] == 200
    except OSError:
        return False


def group_members(pgid: int) -> list[int]:
    """Live (non-zombie) processes in process group ``pgid``.

    Zombies are skipped because an orphaned child (TorchServe's JVM once the Python launcher is
    gone) may never be reaped in a container whose PID 1 does not reap, and would otherwise look
    alive forever.
    """
    members = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        state, pgrp = fields[0], int(fields[2])
        if pgrp == pgid and state != "Z":
            members.append(int(stat.parent.name))
    return members


def group_folders(pgid: int) -> set[str]:
    """Working directories of the live members of process group ``pgid`` (see :func:`group_members`)."""
    folders = set()
    for pid in group_members(pgid):
        try:
            folders.add(os.readlink(f"/proc/{pid}/cwd"))
        except OSError:
            continue  # exited meanwhile, or another user's
    return folders


def group_cpu_seconds(pgid: int) -> float:
    """CPU seconds (user and system) used so far by the live members of process group ``pgid``."""
    ticks = 0
    for pid in group_members(pgid):
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue  # exited meanwhile
        ticks += int(fields[11]) + int(fields[12])  # utime and stime, fields 14 and 15 of proc(5)
    return ticks / os.sysconf("SC_CLK_TCK")


class CpuProgress:
    """Whether a starting server still makes progress: the CPU time its process group uses grows.

    On a busy machine a start takes as long as the scheduler makes it; a server that is given any CPU
    at all is getting on, and only one that used none for ``stall_seconds`` (blocked, deadlocked) is
    stuck. Checked at most once a second: it reads ``/proc``.
    """

    def __init__(self, pgid: int, stall_seconds: float) -> None:
        self.pgid = pgid
        self.stall_seconds = stall_seconds
        self.cpu_seconds = group_cpu_seconds(pgid)
        self.progressed = self.checked = time.monotonic()

    def stalled(self) -> bool:
        now = time.monotonic()
        if now - self.checked >= 1.0:
            self.checked = now
            cpu_seconds = group_cpu_seconds(self.pgid)
            if cpu_seconds > self.cpu_seconds:
                self.progressed = now
            # Always the last figure: a child that exits takes its CPU time out of the sum.
            self.cpu_seconds = cpu_seconds
        return now - self.progressed > self.stall_seconds


def _signal(pid: int, sig: int) -> None:
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        pass


def process_started(pid: int) -> int | None:
    """When process ``pid`` started (clock ticks since boot, ``/proc/<pid>/stat``), or None if it is
    gone or a zombie: with the pid, it tells the process a state file recorded from a later one
    that reuses its pid."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return None if fields[0] == "Z" else int(fields[19])


def stop_group(leader: int, stop_signal: int, timeout: float = 15.0, reap: Callable[[], object] | None = None) -> None:
    """Stop process group ``leader`` gracefully, then SIGKILL whatever of it is alive after ``timeout``.

    Children first, so each exits while its parent still lives to reap it; signalling the leader
    (TorchServe's launcher) first, or while it reaps, would leave the JVM an orphan zombie. A
    launcher exits by itself once its child is gone. ``reap`` (the parent's ``Popen.poll``) collects
    the leader when this process is its parent; a server started by another process is its parent's
    or init's to reap, and zombies do not count as alive.
    """
    deadline = time.monotonic() + timeout

    def alive() -> set[int]:
        if reap is not None:
            reap()
        return set(group_members(leader))

    children = alive() - {leader}
    if children:
        for pid in children:
            _signal(pid, stop_signal)
        while alive() - {leader} and time.monotonic() < deadline:
            time.sleep(0.05)
        launcher_deadline = min(deadline, time.monotonic() + 2.0)
        while leader in alive() and time.monotonic() < launcher_deadline:
            time.sleep(0.05)
    if leader in alive():
        _signal(leader, stop_signal)
    while alive() and time.monotonic() < deadline:
        time.sleep(0.05)
    try:
        os.killpg(leader, signal.SIGKILL)
    except ProcessLookupError:
        pass


class ServerProcess:
    """One server run as its own process group, output appended to ``<workdir>/<name>.log``.

    Subclasses give the command line and readiness check; ``start``/``stop``/``kill`` can be
    called any number of times, so a test can crash or stop a server and bring it back on the
    same port(s).

    Ports: a free port found by :func:`free_ports` is closed before the server binds it, and
    another process (a server or a client of another test, another xdist worker) may take it in
    between. Holding it reserved until the server starts does not work here: the server could
    bind it only if the holder and the server both set ``SO_REUSEPORT`` (Redis, Tansu, Prometheus
    and the JVM do not), and a socket handed down to the child is no help to servers that open
    their own. So a server that chose its ports itself (``choose_ports=True``, no port given) starts
    again on fresh ones when they are taken: before the start (something listens there), or while
    it starts (it exits because it could not bind, or another process's socket listens there and
    not its own). The subclass's :meth:`choose_ports` picks them and rewrites what names them (a
    config file, the command line). At most ``port_attempts`` sets are tried. Only the first
    successful start may move: a restart comes back on the same ports, which clients already
    know, and fails with :class:`PortTakenError` if they were taken meanwhile.
    """

    name = "server"
    stop_signal = signal.SIGTERM
    start_timeout = 30.0
    #: Where set, a start also fails once the server has used no CPU for this many seconds
    #: (:class:`CpuProgress`), and ``start_timeout`` is only the cap on one that keeps getting on.
    stall_timeout: float | None = None
    port_attempts = 5

    def __init__(self, workdir: Path, ports: Sequence[int], *, choose_ports: bool = False) -> None:
        # Absolute: the server runs in it, and its command line names paths in it.
        self.workdir = Path(workdir).resolve()
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.log_path = self.workdir / f"{self.name}.log"
        self.ports = list(ports)
        self._proc: subprocess.Popen[bytes] | None = None
        self._may_move = choose_ports
        self._detached = False
        self._progress: CpuProgress | None = None

    def command(self) -> list[str]:
        raise NotImplementedError

    def spawned(self, pid: int) -> None:
        """Called once the server's process ``pid`` runs, before the wait for it to be ready."""

    def choose_ports(self) -> None:
        """Take fresh free ports: set ``self.ports`` and whatever names them (config files, attributes)."""
        raise NotImplementedError(f"{type(self).__name__} cannot choose new ports")

    def environment(self) -> dict[str, str]:
        return dict(os.environ)

    def wait_ready(self, deadline: float) -> None:
        for port in self.ports:
            self.wait_for_port(port, deadline)

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc else None

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def log_tail(self, lines: int = 40) -> str:
        return log_tail(self.log_path, lines)

    def start_detached(self) -> None:
        """:meth:`start`, and leave the server running when this process exits (``alma dev up``):
        stop it later with :func:`stop_group` and its :attr:`pid`."""
        self._detached = True
        self.start()

    def start(self) -> None:
        """Start and wait until ready; on ports it chose itself and found taken, again on fresh ones."""
        if self.running:
            raise RuntimeError(f"{self.name} is already running (pid {self.pid})")
        attempts = self.port_attempts if self._may_move else 1
        for attempt in range(1, attempts + 1):
            try:
                self._start_once()
            except PortTakenError:
                if attempt == attempts:
                    raise
                with open(self.log_path, "ab") as log:
                    log.write(f"=== port(s) {self.ports} taken by another process: new ports\n".encode())
                self.choose_ports()
            else:
                break
        self._may_move = False

    def _start_once(self) -> None:
        busy = [port for port in self.ports if port_open(port)]
        if busy:
            raise PortTakenError(f"{self.name}: something else already listens on 127.0.0.1 port(s) {busy}")
        began = time.monotonic()
        with open(self.log_path, "ab") as log:
            log.write(f"\n=== starting {self.name}: {' '.join(self.command())}\n".encode())
            log.flush()
            self._proc = subprocess.Popen(
                self.command(),
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                cwd=self.workdir,
                env=self.environment(),
                start_new_session=True,
            )
        if not self._detached:
            _LIVE.add(self)
        if self.stall_timeout is not None:
            self._progress = CpuProgress(self._proc.pid, self.stall_timeout)
        try:
            self.spawned(self._proc.pid)
            self.wait_ready(began + self.start_timeout)
        except ServerStartError as err:
            self.kill()
            taken = [port for port in self.ports if not port_bindable(port)]
            if taken and not isinstance(err, PortTakenError):
                raise PortTakenError(f"{self.name}: port(s) {taken} taken by another process\n{err}") from err
            raise
        except BaseException:
            self.kill()
            raise

    def wait(self) -> int:
        """Block until the server this object started exits; returns its exit code."""
        if self._proc is None:
            raise RuntimeError(f"{self.name} was not started by this object")
        return self._proc.wait()

    def stop(self, timeout: float = 15.0) -> None:
        """Stop gracefully; whatever of the group is still alive after ``timeout`` is SIGKILLed."""
        if self._proc is None:
            return
        stop_group(self._proc.pid, self.stop_signal, timeout, reap=self._proc.poll)
        self.kill()

    def kill(self) -> None:
        """SIGKILL the whole process group at once: a crash, not a shutdown."""
        if self._proc is None:
            return
        try:
            os.killpg(self._proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self._proc.wait()
        self._proc = None
        _LIVE.discard(self)

    def wait_for_port(self, port: int, deadline: float) -> None:
        while not (port_open(port) and self.listens_on(port)):
            self._check_alive(f"listening on 127.0.0.1:{port}")
            if time.monotonic() > deadline:
                self._fail(f"did not listen on 127.0.0.1:{port} within {self.start_timeout:.0f} s")
            time.sleep(0.05)

    def listens_on(self, port: int) -> bool:
        """Whether the socket listening on ``port`` is this server's (any process of its group), not
        another process's that took the port first; True where ``/proc`` cannot tell."""
        listening = listening_inodes(port)
        if not listening or self._proc is None:
            return True
        if listening & socket_inodes(group_members(self._proc.pid)):
            return True
        code = self._proc.poll()
        if code is not None:
            # Another process's socket, and this server is gone: it could not bind.
            raise PortTakenError(f"{self.name} exited with code {code}; another process listens on {port}")
        return False

    def wait_until(self, ready: Callable[[], bool], what: str, deadline: float) -> None:
        while not ready():
            self._check_alive(what)
            if time.monotonic() > deadline:
                self._fail(f"not {what} within {self.start_timeout:.0f} s")
            if self._progress is not None and self._progress.stalled():
                self._fail(f"used no CPU for {self.stall_timeout:.0f} s before {what}: stuck")
            time.sleep(0.1)

    def _check_alive(self, what: str) -> None:
        assert self._proc is not None
        code = self._proc.poll()
        if code is not None:
            self._fail(f"exited with code {code} before {what}")

    def _fail(self, reason: str) -> None:
        raise ServerStartError(f"{self.name} {reason}\n--- {self.log_path} (tail) ---\n{self.log_tail()}")


class RecordedServer(ServerProcess):
    """A server that records its process group in ``<workdir>/<pid_file>``, so that another process
    finds it there and stops it (``alma serve --stop``), and that may run at a lower priority
    (``niceness``) than the training it shares a machine with."""

    pid_file = "server.pid"
    #: True for a server that starts at normal priority and takes :attr:`niceness` once it serves: by
    #: itself, told on its command line (KServe's: serving/runtimes/kserve.py), or in each model process
    #: once its version is loaded, told in ``NICENESS_ENV`` (TorchServe's workers, Triton's Python
    #: backend: alma_daemon/infra/priority.py). Its imports and first load then do not wait for spare
    #: CPU on a busy machine. Else the server runs at :attr:`niceness` from its first instruction.
    lowers_own_priority = False

    def __init__(self, workdir: Path, ports: Sequence[int], *, choose_ports: bool = False, niceness: int = 0) -> None:
        super().__init__(workdir, ports, choose_ports=choose_ports)
        self.pid_path = self.workdir / self.pid_file
        self.niceness = niceness

    def niced(self, command: list[str]) -> list[str]:
        """``command`` under ``nice`` at :attr:`niceness` (inherited by every process it starts)."""
        return (
            ["nice", "-n", str(self.niceness), *command] if self.niceness and not self.lowers_own_priority else command
        )

    def spawned(self, pid: int) -> None:
        self.pid_path.write_text(str(pid))
        if self.niceness and not self.lowers_own_priority:
            set_session_niceness(pid, self.niceness)

    def recorded_pid(self) -> int | None:
        """The process group recorded in the pid file, if a process of it still runs from this folder."""
        try:
            pgid = int(self.pid_path.read_text())
        except (FileNotFoundError, ValueError):
            return None
        # A stale pid file may name a group id the system has since given to something else: the
        # server runs in this folder (ServerProcess starts it there), another process hardly does.
        return pgid if str(self.workdir) in group_folders(pgid) else None

    def refuse_second_start(self, what: str, stop_command: str) -> None:
        """Raise where ``what`` (the server, as messages name it) already runs from this folder."""
        running = self.recorded_pid()
        if running is not None:
            raise RuntimeError(
                f"{what} already runs from {self.workdir} (process group {running}); stop it with `{stop_command}`"
            )

    def stop(self, timeout: float = 15.0) -> None:
        """Stop the server this object started or else the one the pid file records (another process's)."""
        if self.pid is not None:
            super().stop(timeout)
            return
        recorded = self.recorded_pid()
        if recorded is not None:
            stop_group(recorded, self.stop_signal, timeout)
        self.pid_path.unlink(missing_ok=True)

    def kill(self) -> None:
        if self.pid is not None:
            self.pid_path.unlink(missing_ok=True)
        super().kill()
