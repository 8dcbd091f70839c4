"""Cost of keeping ``results.json`` and ``series.csv`` up to date after every step, by stream length.

``ResultsWriter`` encodes each row of the series once and rewrites the files from the encoded rows;
before, every step encoded the whole series again (JSON, CSV and the summary's records), so a run's
writing cost grew with the square of its length. This appends real rows (from a short MNIST run,
repeated with new chunk numbers) one at a time, as the engine does, and times the writes both ways
on the same rows: the writer's, and the whole series encoded again ("every row, every step").

    python benchmarks/bench_results_writer.py [--chunks 500 2000]
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace

from figures_file import write_figures  # this script's folder is on sys.path when it runs

from alma_daemon.config import build_config
from alma_daemon.core.atomic_json import write_json_atomic, write_text_atomic
from alma_daemon.core.engine import EngineState
from alma_daemon.observability.results import CSV_HEADER, ResultsWriter, csv_line, summarize
from alma_daemon.research.simulate import run_simulation


def real_rows() -> tuple[dict, list[dict]]:
    """The config and the two rows of a short MNIST run (SM, one epoch a stage)."""
    config = build_config({"stream": {"megabatches": 2}, "train": {"epochs": 1}, "learner": {"width": 8}})
    results = run_simulation(config, progress=False)
    return results["config"], results["series"]


def write_every_row_every_step(folder: Path, engine: SimpleNamespace, config: dict) -> None:
    series = engine.state.series
    summary = summarize(series, 0.0, engine.state)
    write_json_atomic(folder / "results.json", {"config": config, "series": series, "summary": summary})
    write_text_atomic(folder / "series.csv", CSV_HEADER + "".join(csv_line(row) for row in series))


def timed_stream(chunks: int, template: list[dict], config: dict, writer_kind: str) -> float:
    """Seconds spent writing the files after each of ``chunks`` appended rows."""
    with tempfile.TemporaryDirectory() as folder:
        engine = SimpleNamespace(state=EngineState(), clock=lambda: 0.0)
        writer = ResultsWriter(folder, config)
        spent = 0.0
        for t in range(1, chunks + 1):
            engine.state.series.append({**template[t % len(template)], "t": t, "chunk": t})
            start = time.perf_counter()
            if writer_kind == "writer":
                writer.write(engine)  # type: ignore[arg-type]
            else:
                write_every_row_every_step(Path(folder), engine, config)
            spent += time.perf_counter() - start
        return spent


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--chunks", type=int, nargs="+", default=[500, 2000])
    parser.add_argument("--out", default="benchmarks/results/results_writer.json")
    args = parser.parse_args()
    load_before = os.getloadavg()
    config, template = real_rows()
    runs = []
    for chunks in args.chunks:
        for kind in ("writer", "every row, every step"):
            seconds = timed_stream(chunks, template, config, kind)
            runs.append({"chunks": chunks, "writes": kind, "seconds": seconds, "ms_per_step": 1000 * seconds / chunks})
            print(f"{chunks:6} chunks, {kind:22}: {seconds:7.2f} s in all, {1000 * seconds / chunks:6.2f} ms a step")
    write_figures(args.out, {"runs": runs}, load_before)


if __name__ == "__main__":
    main()
