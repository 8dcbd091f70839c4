"""How checkpoint versions are named on an Open Inference Protocol server, and which one is the default.

The protocol (KServe's v2) routes ``/v2/models/{name}/versions/{v}`` exist on paper, but KServe
answers them 501 and MLServer and Triton each version differently, so versions are model names:

- ``<model>-v<N>`` serves checkpoint version N: what the publisher loads, probes and, once it is
  neither live nor among the ``serving.keep_versions`` kept, unloads;
- ``<model>`` serves the default version: the one clients call. Loading ``<model>`` tells the
  server to read the default file (:data:`DEFAULT_FILE`, beside the versions in the model store)
  and serve that version under the name, an atomic switch where the server keeps the model loaded
  under ``<model>-v<N>`` (KServe: the same object under a second name).

Both sides import this module (the publisher, and the server's model repository), which imports
nothing heavy.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

from alma_daemon.core.atomic_json import write_json_atomic

#: ``<model_store>/<model>/oip_default.json``: the version that ``<model>`` serves, written by the
#: publisher before it asks the server to load ``<model>``.
DEFAULT_FILE = "oip_default.json"


def versioned_name(model: str, version: int) -> str:
    """The name a server loads checkpoint ``version`` of ``model`` under."""
    return f"{model}-v{version}"


def version_of(model: str, name: str) -> int | None:
    """The checkpoint version a model name serves (None: not a versioned name of ``model``)."""
    found = re.fullmatch(re.escape(model) + r"-v([1-9][0-9]*)", name)
    return int(found.group(1)) if found else None


def write_default(folder: Path, version: int) -> None:
    """Record ``version`` as the one ``<model>`` serves (``folder`` is the model's folder in the store)."""
    write_json_atomic(folder / DEFAULT_FILE, {"version": version})


def read_default(folder: Path) -> int | None:
    """The version ``<model>`` is to serve, None where none was recorded yet."""
    try:
        version = json.loads((folder / DEFAULT_FILE).read_text())["version"]
    except FileNotFoundError:
        return None
    except (json.JSONDecodeError, KeyError, TypeError) as err:
        raise ValueError(f"{folder / DEFAULT_FILE} is not a default-version file: {err}") from None
    if isinstance(version, bool) or not isinstance(version, int) or version < 1:
        raise ValueError(f"{folder / DEFAULT_FILE} names no version: {version!r}")
    return version
