"""Where a Triton installation is: nvidia-pytriton's wheel in a virtualenv of its own (scripts/setup_triton.sh).

The wheel holds ``pytriton/tritonserver`` (``bin/tritonserver``, the Python backend, and the backend's
stub process built for each Python from 3.8 to 3.13) and the shared libraries they need
(``nvidia_pytriton.libs``). The virtualenv's interpreter says where they are, and where its own
shared library is: the stub embeds it. Asked once per start, in a process of that interpreter.
"""

from __future__ import annotations

import json
import os
import subprocess
from dataclasses import dataclass
from pathlib import Path

import serving
from alma_daemon.local_servers.processes import ServerNotInstalled

#: The interpreter of Triton's virtualenv.
PYTHON_ENV = "ALMA_TRITON_PYTHON"
#: ``.venvs/triton`` in the checkout, where scripts/setup_triton.sh makes it.
CHECKOUT = Path(serving.__file__).resolve().parent.parent
DEFAULT_PYTHON = CHECKOUT / ".venvs" / "triton" / "bin" / "python"

#: What the virtualenv's interpreter tells about itself and the wheel: printed as JSON.
_PROBE = """
import importlib.util, json, sys, sysconfig
spec = importlib.util.find_spec("pytriton")
print(json.dumps({
    "pytriton": list(spec.submodule_search_locations) if spec else None,
    "version": f"{sys.version_info[0]}.{sys.version_info[1]}",
    "libdir": sysconfig.get_config_var("LIBDIR"),
    "library": sysconfig.get_config_var("INSTSONAME"),
}))
"""


def triton_python() -> Path:
    """The interpreter of Triton's virtualenv: ``$ALMA_TRITON_PYTHON``, else :data:`DEFAULT_PYTHON`."""
    return Path(os.environ.get(PYTHON_ENV) or DEFAULT_PYTHON)


@dataclass(frozen=True)
class TritonInstall:
    """Where a virtualenv's tritonserver, its libraries and the Python backend for its Python are."""

    python: Path
    #: The wheel's ``pytriton/tritonserver``: ``bin/tritonserver``, ``backends/python``, the stubs.
    dist: Path
    #: The wheel's shared libraries (``nvidia_pytriton.libs``), and the folder of the Python's own.
    libraries: tuple[Path, ...]
    python_version: str

    @property
    def server(self) -> Path:
        return self.dist / "bin" / "tritonserver"

    @property
    def stub(self) -> Path:
        """The Python backend's stub built for this Python."""
        return self.dist / "python_backend_stubs" / self.python_version / "triton_python_backend_stub"

    @classmethod
    def find(cls, python: Path) -> TritonInstall:
        """The install beside ``python``; :class:`ServerNotInstalled`, one line saying what to run, where
        it is missing or its Python cannot run the backend."""
        fix = (
            f"run scripts/setup_triton.sh (or set {PYTHON_ENV} to the interpreter of a virtualenv with "
            "'alma-daemon[triton]' and torch)"
        )
        if not python.is_file():
            raise ServerNotInstalled(f"--kind triton (serving.kind): Triton is not installed: no {python}; {fix}")
        try:
            found = subprocess.run([str(python), "-c", _PROBE], capture_output=True, text=True, timeout=60, check=True)
            facts = json.loads(found.stdout)
        except (OSError, subprocess.SubprocessError, ValueError) as err:
            raise ServerNotInstalled(f"--kind triton (serving.kind): {python} does not run ({err}); {fix}") from None
        if not facts["pytriton"]:
            raise ServerNotInstalled(
                f"--kind triton (serving.kind): nvidia-pytriton is not installed beside {python}; {fix}"
            )
        dist = Path(facts["pytriton"][0]) / "tritonserver"
        library = Path(facts["libdir"] or "") / (facts["library"] or "")
        install = cls(python, dist, (dist.parent.parent / "nvidia_pytriton.libs", library.parent), facts["version"])
        if not install.stub.is_file():
            raise ServerNotInstalled(
                f"--kind triton (serving.kind): Triton's Python backend has no stub for Python {facts['version']} "
                f"(it has {', '.join(sorted(p.name for p in install.stub.parent.parent.iterdir()))}): make the "
                f"virtualenv {python.parent.parent} with one of those"
            )
        if not library.is_file():
            raise ServerNotInstalled(
                f"--kind triton (serving.kind): Triton's Python backend embeds libpython, and {python}'s is "
                f"missing ({library}): make the virtualenv from a Python built with --enable-shared"
            )
        return install
