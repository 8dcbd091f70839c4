"""Model archives (.mar) for TorchServe, built with torch-model-archiver from a checkpoint folder.

An archive holds :mod:`serving.runtimes.torchserve_handler` plus the checkpoint's ``spec.json`` and
``weights.safetensors`` as extra files (and the source of a team's ``learner.model`` module,
:mod:`serving.runtimes.bundled_model`), and carries the checkpoint's version.

Its file name, ``<model>-v<version>-<digest>.mar``, names the checkpoint's content as well as its
version, because a version number can be written twice (see :func:`serving.publishing.live_pointer.withdraw`).
The name alone tells which checkpoint an archive holds, so:

- an existing archive is reused only when it holds exactly the checkpoint's files;
- TorchServe, which copies a registered archive into its own model store under its file name and
  keeps that copy across its restarts, never confuses the two;
- a registration, whose ``modelUrl`` is the archive's URL or name, shows which checkpoint it
  serves (:meth:`serving.publishing.torchserve.TorchServePublisher.stage` replaces a stale one).
"""

from __future__ import annotations

import glob
import hashlib
import os
import shutil
import tempfile
from pathlib import Path

from alma_daemon.core.checkpoint_index import SPEC, WEIGHTS
from serving.runtimes.bundled_model import BUNDLED_SOURCE, module_source

#: TorchServe's handler, copied into every archive (TorchServe imports it by its file name there).
HANDLER = Path(__file__).parents[1] / "runtimes" / "torchserve_handler.py"
#: The folder of a model's archives, beside its versions: ``<model_store>/<model>/archives/``.
ARCHIVES = "archives"
#: Hex digits of the content digest kept in an archive's name (64 bits).
DIGEST_CHARS = 16


def checkpoint_digest(checkpoint: str | Path) -> str:
    """SHA-256 of the checkpoint's archived files (``spec.json``, ``weights.safetensors``), shortened."""
    checkpoint = Path(checkpoint)
    missing = [name for name in (SPEC, WEIGHTS) if not (checkpoint / name).is_file()]
    if missing:
        raise FileNotFoundError(f"checkpoint {checkpoint} lacks {', '.join(missing)}")
    digest = hashlib.sha256()
    for name in (SPEC, WEIGHTS):
        part = hashlib.sha256()
        with open(checkpoint / name, "rb") as f:
            while block := f.read(1 << 20):
                part.update(block)
        digest.update(part.digest())
    return digest.hexdigest()[:DIGEST_CHARS]


def archive_name(model_name: str, version: int, digest: str) -> str:
    return f"{model_name}-v{version}-{digest}.mar"


def build_archive(checkpoint: str | Path, model_name: str, version: int, out_dir: str | Path) -> Path:
    """The archive of a checkpoint folder in ``out_dir``, named by :func:`archive_name`; one already
    built from the same files is reused.

    The archive is written under a temporary name and renamed, so a crash never leaves a partial
    archive where a later call would take it for a complete one.
    """
    # Imported here: only the TorchServe publisher needs the archiver's package.
    from model_archiver.model_archiver_config import ModelArchiverConfig
    from model_archiver.model_packaging import generate_model_archive

    checkpoint, out_dir = Path(checkpoint), Path(out_dir)
    target = out_dir / archive_name(model_name, version, checkpoint_digest(checkpoint))
    if target.is_file():
        return target
    out_dir.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{target.stem}-", dir=out_dir))
    extra_files = [str(checkpoint / SPEC), str(checkpoint / WEIGHTS)]
    source = module_source(checkpoint / SPEC)
    if source is not None:
        shutil.copyfile(source, staging / BUNDLED_SOURCE)
        extra_files.append(str(staging / BUNDLED_SOURCE))
    try:
        generate_model_archive(
            ModelArchiverConfig(
                model_name=target.stem,
                handler=str(HANDLER),
                version=str(version),
                extra_files=",".join(extra_files),
                export_path=str(staging),
                # Safetensors weights barely compress; storing them makes archiving and loading faster.
                archive_format="zip-store",
            )
        )
        os.replace(staging / target.name, target)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return target


def remove_archives(out_dir: str | Path, model_name: str, version: int) -> None:
    """Delete the archives of ``version`` in ``out_dir``, as its checkpoint is being deleted.

    Only to free the disk: an archive's name holds its checkpoint's digest, so one left behind is
    never taken for another checkpoint of the same version.
    """
    for path in Path(out_dir).glob(f"{glob.escape(model_name)}-v{version}-*.mar"):
        path.unlink(missing_ok=True)
