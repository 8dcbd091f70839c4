"""The progress bar of a run: one tick per chunk the engine processed, for ``alma simulate`` and ``alma run``."""

from __future__ import annotations

from tqdm import tqdm
from tqdm.contrib.logging import logging_redirect_tqdm

from alma_daemon.core.engine import Engine, EngineObserver
from alma_daemon.core.records import StepRecord


class ProgressBar(EngineObserver):
    """A tqdm bar over the stream's chunks showing the latest test measure and the CER."""

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
        if record.cumulative_error is not None:
            shown["cer"] = f"{record.cumulative_error:.4g}"
        shown["flops"] = f"{record.cumulative_train_flops:.3g}"
        self.bar.set_postfix(shown, refresh=False)
        # The engine's count rather than one per call: a daemon's step redone after a Redis outage
        # is not counted twice.
        self.bar.update(engine.state.chunks_seen - self.bar.n)

    def close(self) -> None:
        if self._logs_above is not None:
            self._logs_above.__exit__(None, None, None)
            self._logs_above = None
        self.bar.close()
