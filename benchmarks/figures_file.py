"""The figures file every CPU benchmark writes: its results, with the machine and the load they were taken on.

Timings on a shared machine are only comparable with the load beside them, so the load average is
recorded before and after the run.
"""

from __future__ import annotations

import json
import os
import platform
from pathlib import Path
from typing import Any

import torch


def write_figures(out: str | Path, results: dict[str, Any], load_before: tuple[float, ...], machine: str = "") -> None:
    """Write ``results`` to ``out`` as JSON, after the machine, torch version, threads and load."""
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    figures = {
        "machine": machine or platform.processor() or platform.machine(),
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        "load_average_before": load_before,
        "load_average_after": os.getloadavg(),
        **results,
    }
    out.write_text(json.dumps(figures, indent=1))
    print(f"written: {out}")
