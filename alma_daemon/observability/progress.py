"""Progress a person waits on: the bar of a run (one tick per chunk the engine processed, for ``alma
simulate`` and ``alma run``), and :func:`told_while`, which says how long a blocking call has been
waiting (a TorchServe loading its workers)."""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Iterator

from tqdm import tqdm
from tqdm.contrib.logging import logging_redirect_tqdm

from alma_daemon.core.engine import Engine, EngineObserver
from alma_daemon.core.records import StepRecord
from alma_daemon.observability.measure_words import PAPER_MEASURE


class ProgressBar(EngineObserver):
    """A tqdm bar over the stream's chunks showing the latest test measure and the CER (the cumulative
    measure of a task judged by another)."""

    def __init__(self, total: int | None, enabled: bool = True, initial: int = 0):
        """``initial``: chunks processed before (a daemon resuming its stream); the rate counts the others.
        ``total`` None: a stream without a known end (a daemon without ``--until-chunks``)."""
        self.bar = tqdm(total=total, initial=initial, unit="chunk", disable=not enabled, dynamic_ncols=True)
        # Log lines go through tqdm while the bar is up, each on a line of its own above the bar
        # rather than glued to it.
        self._logs_above = logging_redirect_tqdm() if enabled else None
        if self._logs_above is not None:
            self._logs_above.__enter__()

    def on_step(self, record: StepRecord, engine: Engine) -> None:
        shown = {}
        if record.test is not None:
            shown[f"test_{record.measure}"] = f"{record.test:.4g}"
        if record.cumulative is not None:
            shown["cer" if record.measure == PAPER_MEASURE else f"cumulative_{record.measure}"] = (
                f"{record.cumulative:.4g}"
            )
        shown["flops"] = f"{record.cumulative_train_flops:.3g}"
        self.bar.set_postfix(shown, refresh=False)
        # The engine's count rather than one per call: a daemon's step redone after a Redis outage
        # is not counted twice.
        self.bar.update(engine.state.chunks_seen - self.bar.n)

    def show_waiting(self, waiting_for: str) -> None:
        """Say before the bar what the run waits for (a server that is down, the last swap); empty
        clears it."""
        self.bar.set_description_str(f"waiting for {waiting_for}" if waiting_for else "", refresh=True)

    def close(self) -> None:
        if self._logs_above is not None:
            self._logs_above.__exit__(None, None, None)
            self._logs_above = None
        self.bar.close()


@contextlib.contextmanager
def told_while(
    report: Callable[[float], None], first_seconds: float = 5.0, every_seconds: float = 10.0
) -> Iterator[None]:
    """Call ``report(seconds_so_far)`` from a thread after ``first_seconds`` of the block and then
    every ``every_seconds``, until the block ends: a wait inside one blocking call is told as it goes,
    and a short one not at all."""
    done = threading.Event()
    started = time.monotonic()

    def tell() -> None:
        delay = first_seconds
        while not done.wait(delay):
            report(time.monotonic() - started)
            delay = every_seconds

    thread = threading.Thread(target=tell, name="alma-told-while", daemon=True)
    thread.start()
    try:
        yield
    finally:
        done.set()
        thread.join()
