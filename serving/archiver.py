"""Model archives (.mar) for TorchServe, built with torch-model-archiver from a checkpoint folder.

An archive holds :mod:`serving.handler` plus the checkpoint's ``spec.json`` and
``weights.safetensors`` as extra files, and carries the checkpoint's version. Its file name
includes the version, because TorchServe copies a registered archive into its model store under
its file name, and a version is never reused.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

from alma_daemon.core.checkpoints import SPEC, WEIGHTS

HANDLER = Path(__file__).with_name("handler.py")


def archive_name(model_name: str, version: int) -> str:
    return f"{model_name}-v{version}.mar"


def build_archive(checkpoint: str | Path, model_name: str, version: int, out_dir: str | Path) -> Path:
    """``<out_dir>/<model_name>-v<version>.mar`` for a checkpoint folder; an existing one is reused.

    The archive is written under a temporary name and renamed, so a crash never leaves a partial
    archive where a later call would take it for a complete one.
    """
    # Imported here: only the TorchServe publisher needs the archiver's package.
    from model_archiver.model_archiver_config import ModelArchiverConfig
    from model_archiver.model_packaging import generate_model_archive

    checkpoint, out_dir = Path(checkpoint), Path(out_dir)
    target = out_dir / archive_name(model_name, version)
    if target.is_file():
        return target
    missing = [name for name in (SPEC, WEIGHTS) if not (checkpoint / name).is_file()]
    if missing:
        raise FileNotFoundError(f"checkpoint {checkpoint} lacks {', '.join(missing)}")
    out_dir.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{target.stem}-", dir=out_dir))
    try:
        generate_model_archive(
            ModelArchiverConfig(
                model_name=target.stem,
                handler=str(HANDLER),
                version=str(version),
                extra_files=f"{checkpoint / SPEC},{checkpoint / WEIGHTS}",
                export_path=str(staging),
                # Safetensors weights barely compress; storing them makes archiving and loading faster.
                archive_format="zip-store",
            )
        )
        os.replace(staging / target.name, target)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return target
