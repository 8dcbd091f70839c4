"""Triton's model repository over a model store, written per version (``serving.kind: triton``).

Triton loads only names that have a folder in its model repository, and each answer carries the
number of the Triton version that gave it. So the publisher writes a folder for each name of
:mod:`serving.protocols.version_names` before it asks Triton to load it, in
``<daemon.checkpoint_dir>/triton_repository`` (beside the model store's folders, so the server sees
it wherever it sees the checkpoints), with one version folder numbered as the checkpoint the name
serves::

    triton_repository/
        alma-v7/config.pbtxt      Python backend, the task's tensors, version_policy: 7
        alma-v7/7/model.py        imports serving.runtimes.triton.model's TritonPythonModel
        alma/config.pbtxt         an ensemble of one step, alma-v7, with the same tensors
        alma/7/                   (empty: an ensemble's version folder)

``<model>-v<N>`` rebuilds checkpoint N in a Python backend process of its own, from the folder the
repository lies in (``spec.json`` and safetensors weights: :mod:`serving.runtimes.triton.served`), so no
file names an absolute path. ``<model>``, the name clients call, is an ensemble whose one step is the
default version's name: Triton runs it in the server, with no process and no copy of the weights of
its own, and loading it with another step switches the default at once (as KServe's server serves
one object under both names). Triton loads the new ensemble before it drops the old one, so a
request is answered by the old version or the new one, never neither; unloading the step's model
takes the ensemble down with it, and loading it again brings the ensemble back.

Triton reloads a model on a load request only where its folder changed (modification times, all
files), so a folder whose files would stay the same is not touched: making a loaded version the
default again, or loading it again, reloads nothing. Each Python model's config holds a fingerprint
of its checkpoint's weights file, so a version withdrawn and redone under the same number
(serving/publishing/live_pointer.py) changes its config and is loaded again. For the same reason each
version folder of a Python model holds a file named ``__pycache__``: Python, importing model.py,
would otherwise write its bytecode there, a change Triton would take for a new model (it reloaded a
version loaded a second earlier on the ensemble's switch to it). Files are written atomically.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any

from alma_daemon.core.checkpoint_index import SPEC, WEIGHTS, CheckpointIndex
from serving.protocols.version_names import version_of, versioned_name

if TYPE_CHECKING:
    from alma_daemon.data.task_info import TaskInfo

#: The repository's folder in the model store root (``daemon.checkpoint_dir``).
REPOSITORY_FOLDER = "triton_repository"
CONFIG = "config.pbtxt"
MODEL_FILE = "model.py"
#: A file where Python would make its bytecode folder, so that it makes none (module docstring).
BYTECODE_BLOCKER = "__pycache__"
#: Config parameters: the model-store model a name serves, and its checkpoint's fingerprint.
MODEL_PARAMETER = "alma_model"
CHECKPOINT_PARAMETER = "alma_checkpoint"
#: The environment variable whose folders a version's model.py puts first on ``sys.path``: Triton's
#: stub process ignores ``PYTHONPATH`` (alma_daemon/local_servers/triton.py sets this one instead).
PATH_ENV = "ALMA_TRITON_PYTHONPATH"

#: Every version folder's model.py: the same text for every name, so writing it again changes nothing.
MODEL_SOURCE = f'''"""Triton's Python backend model for one checkpoint version, written by
serving/runtimes/triton/repository.py: the code is serving/runtimes/triton/model.py, in the Python that
runs Triton's Python backend."""

import os
import sys

# The backend's stub process ignores PYTHONPATH; `alma serve --kind triton` names its checkout here.
for _folder in reversed([f for f in os.environ.get("{PATH_ENV}", "").split(os.pathsep) if f]):
    if _folder not in sys.path:
        sys.path.insert(0, _folder)

from serving.runtimes.triton.model import TritonPythonModel  # noqa: E402,F401
'''

#: The protocol's datatypes as Triton's model config spells them.
TRITON_TYPES = {
    "BOOL": "TYPE_BOOL",
    "UINT8": "TYPE_UINT8",
    "UINT16": "TYPE_UINT16",
    "UINT32": "TYPE_UINT32",
    "UINT64": "TYPE_UINT64",
    "INT8": "TYPE_INT8",
    "INT16": "TYPE_INT16",
    "INT32": "TYPE_INT32",
    "INT64": "TYPE_INT64",
    "FP16": "TYPE_FP16",
    "FP32": "TYPE_FP32",
    "FP64": "TYPE_FP64",
    "BYTES": "TYPE_STRING",
}


def repository_root(store_root: Path) -> Path:
    """Triton's model repository for the model store at ``store_root`` (``daemon.checkpoint_dir``)."""
    return Path(store_root) / REPOSITORY_FOLDER


def store_root_of(model_folder: Path) -> Path:
    """The model store a name's folder in the repository belongs to (the inverse of :func:`repository_root`)."""
    return Path(model_folder).parent.parent


class TritonRepository:
    """The folders of one model's names in the repository of its model store (module docstring)."""

    def __init__(self, store: CheckpointIndex):
        check_name(store.model_name)
        self.store = store
        self.model = store.model_name
        self.root = repository_root(store.root)

    def folder(self, name: str) -> Path:
        return self.root / name

    def write_version(self, version: int) -> None:
        """The folder of ``<model>-v<version>``: a Python model that rebuilds checkpoint ``version``."""
        checkpoint = self._checkpoint(version)
        name = versioned_name(self.model, version)
        folder = self.folder(name)
        tensors = tensors_of(task_of(checkpoint))
        _write_if_changed(folder / CONFIG, python_config(name, self.model, version, tensors, fingerprint(checkpoint)))
        _write_if_changed(folder / str(version) / MODEL_FILE, MODEL_SOURCE)
        _write_if_changed(folder / str(version) / BYTECODE_BLOCKER, "")

    def write_default(self, version: int) -> None:
        """The folder of ``<model>``, the name clients call: an ensemble of ``<model>-v<version>``. Other
        version folders of the name go (its config names only ``version``: Triton reads no other)."""
        tensors = tensors_of(task_of(self._checkpoint(version)))
        folder = self.folder(self.model)
        step = versioned_name(self.model, version)
        _write_if_changed(folder / CONFIG, ensemble_config(self.model, version, tensors, step))
        (folder / str(version)).mkdir(parents=True, exist_ok=True)
        for child in folder.iterdir():
            if child.is_dir() and child.name.isdigit() and child.name != str(version):
                shutil.rmtree(child, ignore_errors=True)

    def default_version(self) -> int | None:
        """The checkpoint the folder of ``<model>`` serves, None where it has none."""
        folder = self.folder(self.model)
        versions = [int(child.name) for child in folder.glob("[0-9]*") if child.name.isdigit() and child.is_dir()]
        return max(versions) if (folder / CONFIG).is_file() and versions else None

    def has(self, name: str) -> bool:
        return (self.folder(name) / CONFIG).is_file()

    def remove_versions(self, keep: set[str]) -> list[int]:
        """Delete the folders of this model's versioned names not in ``keep`` (the names the server has
        loaded); the versions whose folders went."""
        removed = []
        for child in sorted(self.root.glob(f"{self.model}-v*")) if self.root.is_dir() else []:
            version = version_of(self.model, child.name)
            if version is not None and child.name not in keep:
                shutil.rmtree(child, ignore_errors=True)
                removed.append(version)
        return removed

    def _checkpoint(self, version: int) -> Path:
        checkpoint = self.store.path(version)
        if not (checkpoint / SPEC).is_file():
            raise FileNotFoundError(f"no checkpoint version {version} in {self.store.folder}")
        return checkpoint


def task_of(checkpoint: Path) -> TaskInfo:
    """The task a checkpoint folder's ``spec.json`` records, without loading the model."""
    from alma_daemon.data.task_info import TaskInfo

    return TaskInfo.from_dict(json.loads((checkpoint / SPEC).read_text())["task"])


def fingerprint(checkpoint: Path) -> str:
    """What tells a checkpoint's weights file from another written under the same number."""
    stat = (checkpoint / WEIGHTS).stat()
    return f"{stat.st_ino}-{stat.st_mtime_ns}-{stat.st_size}"


def tensors_of(task: TaskInfo) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The input and output tensors a name of ``task`` declares, as the protocol's metadata lists them.

    The codec's (:meth:`serving.protocols.codecs.Codec.oip_signature`), with one datatype each, as Triton checks
    it before the model sees a request: UINT8 for raw pixels, what clients and the publisher's probe
    send (:meth:`~serving.protocols.codecs.Codec.encode_oip`). A task of named features declares both
    ways of asking, one tensor of examples and one per feature; every input is optional, and the codec
    says what is missing.
    """
    from serving.protocols.codecs import codec_for

    inputs, outputs = codec_for(task).oip_signature()
    if task.kind != "language_model" and task.pixels:
        inputs = [{**tensor, "datatype": "UINT8"} if tensor["name"] == "x" else tensor for tensor in inputs]
    features = task.extra.get("features") or []
    if features and "x" not in features:
        inputs = [*inputs, {"name": "x", "datatype": "FP32", "shape": [-1, *task.input_shape]}]
    return inputs, outputs


def python_config(
    name: str, model: str, version: int, tensors: tuple[list[dict[str, Any]], list[dict[str, Any]]], checkpoint: str
) -> str:
    """The config.pbtxt of ``<model>-v<N>``: the Python backend, checkpoint ``version`` only.

    ``max_batch_size: 0``: the first dimension is the request's examples, any number of them. No
    instance group: Triton makes one instance per GPU where there are GPUs, one on the CPU otherwise.
    """
    return _config(
        name,
        ['backend: "python"'],
        version,
        tensors,
        [_parameter(MODEL_PARAMETER, model), _parameter(CHECKPOINT_PARAMETER, checkpoint)],
    )


def ensemble_config(
    name: str, version: int, tensors: tuple[list[dict[str, Any]], list[dict[str, Any]]], step: str
) -> str:
    """The config.pbtxt of ``<model>``: an ensemble of one step, ``step``, each tensor passed as it is."""
    inputs, outputs = tensors
    maps = [f"input_map {{ key: {_text(t['name'])} value: {_text(t['name'])} }}" for t in inputs]
    maps += [f"output_map {{ key: {_text(t['name'])} value: {_text(t['name'])} }}" for t in outputs]
    scheduling = [
        "ensemble_scheduling { step [ {",
        f"  model_name: {_text(step)} model_version: -1",
        *(f"  {line}" for line in maps),
        "} ] }",
    ]
    return _config(name, ['platform: "ensemble"'], version, tensors, scheduling)


def check_name(model: str) -> None:
    """Refuse a model name that cannot be a folder of Triton's repository (one line naming the key)."""
    if not model or model in (".", "..") or "/" in model or any(ord(c) < 32 or c in '"\\' for c in model):
        raise ValueError(
            f"serving.model_name: {model!r} cannot name a folder of Triton's model repository: "
            "use letters, digits, '-', '_' or '.'"
        )


def _config(
    name: str,
    kind: list[str],
    version: int,
    tensors: tuple[list[dict[str, Any]], list[dict[str, Any]]],
    rest: list[str],
) -> str:
    inputs, outputs = tensors
    lines = [
        f"name: {_text(name)}",
        *kind,
        "max_batch_size: 0",
        f"version_policy: {{ specific: {{ versions: [ {version} ] }} }}",
        "input [",
        ",\n".join(_tensor(tensor, optional=True) for tensor in inputs),
        "]",
        "output [",
        ",\n".join(_tensor(tensor) for tensor in outputs),
        "]",
        *rest,
    ]
    return "\n".join(lines) + "\n"


def _tensor(tensor: dict[str, Any], optional: bool = False) -> str:
    dims = ", ".join(str(size) for size in tensor["shape"])
    flag = " optional: true" if optional else ""
    return f"  {{ name: {_text(tensor['name'])} data_type: {TRITON_TYPES[tensor['datatype']]} dims: [ {dims} ]{flag} }}"


def _parameter(key: str, value: str) -> str:
    return f"parameters: {{ key: {_text(key)} value: {{ string_value: {_text(value)} }} }}"


def _text(value: str) -> str:
    """A string in protobuf's text format: quoted, with its quotes and backslashes escaped."""
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'


def _write_if_changed(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` atomically, unless the file holds it already (Triton goes by the
    files' modification times: a file written again would reload the model)."""
    try:
        if path.read_text() == text:
            return
    except IsADirectoryError:  # a bytecode folder written before its blocker was
        shutil.rmtree(path)
    except (FileNotFoundError, UnicodeDecodeError):
        pass
    path.parent.mkdir(parents=True, exist_ok=True)
    handle, temporary = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(handle, "w") as file:
            file.write(text)
        os.chmod(temporary, 0o644)
        os.replace(temporary, path)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise
