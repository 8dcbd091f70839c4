"""Drift detectors for the ``adaptive`` policy (``policy.drift_detector``): does the newest chunk's
error say that the stream changed?

Each detector reads one :class:`Rise` per new chunk: how far the chunk's measure lies above the live
model's mean so far, as a jump on the rules' scale and in standard errors. The standard error makes
the sequential tests free of the stream's error level and chunk size, so one configuration serves
every stream.

- ``threshold`` (the default): one chunk 0.1 above and 4 standard errors above. Blind to rises of a
  few points, which a single chunk of a hundred examples cannot tell from noise.
- ``page_hinkley`` and ``adwin``: River's sequential tests on the chunks' standard-error scores. They
  add up small rises over chunks, so a rise of a couple of points is seen within tens of chunks
  (docs/policies.md, "Small drifts", gives the delays and false alarms measured). They need River
  (``pip install alma-daemon[river]``). Only increases count: a score is clipped to
  +-:data:`SCORE_CLIP` so one odd chunk cannot swamp the test.

River's detectors do not serialize, so their state is the scores fed since their last reset (at
most :data:`HISTORY`), replayed into a fresh detector on load.
"""

from __future__ import annotations

import importlib
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any, ClassVar

from alma_daemon.config import ConfigError

#: threshold: a chunk signals a drift when its error is this many standard errors above the live model's ...
DRIFT_SIGNIFICANCE = 4.0
#: ... and at least this much higher (an error rate, or the log of a perplexity).
DRIFT_JUMP = 0.1
#: Sequential detectors read scores clipped to this many standard errors either way.
SCORE_CLIP = 4.0
#: Scores a sequential detector keeps to rebuild itself on load (about a long stream's stationary stretch).
HISTORY = 1000
#: page_hinkley: the rise per chunk, in standard errors, that the test ignores (its drift magnitude) ...
PAGE_HINKLEY_DELTA = 0.25
#: ... the summed rise, in standard errors, that signals a drift ...
PAGE_HINKLEY_THRESHOLD = 8.0
#: ... and the chunks it reads before it may signal one.
PAGE_HINKLEY_MIN_CHUNKS = 10
#: adwin: the confidence parameter of the cut between the window's older and newer parts.
ADWIN_DELTA = 0.5


@dataclass(frozen=True)
class Rise:
    """The newest chunk's measure against the live model's so far, on the policy rules' scale."""

    #: The chunk's measure minus the reference mean (an error rate, or a log-perplexity).
    jump: float
    #: ``jump`` in standard errors of the difference.
    score: float


class DriftDetector(ABC):
    """Reads one :class:`Rise` per new chunk; :meth:`update` says whether the stream drifted."""

    name: ClassVar[str]
    #: Whether it reads the first chunk after a stage, measured against the model before the stage: a
    #: stage's gain shows there, and would bias a test that tracks the scores' mean.
    reads_stage_changes: ClassVar[bool] = False

    @abstractmethod
    def update(self, rise: Rise) -> bool:
        """Read the newest chunk; True when it completes the evidence of a drift."""

    def why(self) -> str:
        """What made the last :meth:`update` fire, for the decision's reason ("" when the jump says it all)."""
        return ""

    def reset(self) -> None:  # noqa: B027 (a detector with no memory has nothing to reset)
        """Start over, as at a new regime of the stream."""

    def state_dict(self) -> dict[str, Any]:
        """State to persist across daemon restarts (JSON-able)."""
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:  # noqa: B027 (stateless detectors need not override it)
        """Restore what :meth:`state_dict` returned."""


#: ``policy.drift_detector`` -> its class.
DETECTORS: dict[str, type[DriftDetector]] = {}


def register_detector(cls: type[DriftDetector]) -> type[DriftDetector]:
    """Class decorator adding a detector to :data:`DETECTORS` under ``cls.name``."""
    DETECTORS[cls.name] = cls
    return cls


def build_detector(name: str) -> DriftDetector:
    return DETECTORS[name]()


@register_detector
class Threshold(DriftDetector):
    """One chunk whose error is :data:`DRIFT_JUMP` and :data:`DRIFT_SIGNIFICANCE` standard errors above."""

    name = "threshold"
    reads_stage_changes = True

    def update(self, rise: Rise) -> bool:
        return rise.score >= DRIFT_SIGNIFICANCE and rise.jump >= DRIFT_JUMP


def _river_drift(detector: str) -> Any:
    """River's ``drift`` module, or a one-line refusal naming the extra to install."""
    try:
        return importlib.import_module("river.drift")
    except ImportError:
        raise ConfigError(f"policy.drift_detector: {detector} needs River: pip install alma-daemon[river]") from None


class _RiverDetector(DriftDetector):
    """A River detector fed clipped scores; rebuilt from the scores since its last reset on load."""

    def __init__(self) -> None:
        self._drift = _river_drift(self.name)
        self.scores: list[float] = []
        self.detector = self._build()

    @abstractmethod
    def _build(self) -> Any:
        """A fresh River detector."""

    def _feed(self, score: float) -> bool:
        """Update the River detector with one score; True when it signals a rise."""
        self.detector.update(score)
        return bool(self.detector.drift_detected)

    def update(self, rise: Rise) -> bool:
        score = max(-SCORE_CLIP, min(SCORE_CLIP, rise.score))
        self.scores.append(score)
        del self.scores[:-HISTORY]
        return self._feed(score)

    def reset(self) -> None:
        self.scores = []
        self.detector = self._build()

    def state_dict(self) -> dict[str, Any]:
        return {"scores": list(self.scores)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.reset()
        for score in state.get("scores", []):
            self.update(Rise(jump=0.0, score=float(score)))


@register_detector
class PageHinkley(_RiverDetector):
    """River's Page-Hinkley test for an increase of the mean score."""

    name = "page_hinkley"

    def _build(self) -> Any:
        return self._drift.PageHinkley(
            min_instances=PAGE_HINKLEY_MIN_CHUNKS,
            delta=PAGE_HINKLEY_DELTA,
            threshold=PAGE_HINKLEY_THRESHOLD,
            alpha=1.0,
            mode="up",
        )

    def why(self) -> str:
        return (
            f"page_hinkley: the chunks' rise above their mean, less {PAGE_HINKLEY_DELTA:g} standard error(s) "
            f"each, summed past {PAGE_HINKLEY_THRESHOLD:g} standard errors over {len(self.scores)} chunk(s)"
        )


@register_detector
class Adwin(_RiverDetector):
    """River's ADWIN: a cut of its window into an older and a newer part whose mean scores differ; only a
    higher newer part counts."""

    name = "adwin"

    def _build(self) -> Any:
        return self._drift.ADWIN(delta=ADWIN_DELTA, clock=1)

    def _feed(self, score: float) -> bool:
        before = self.detector.estimation
        self.detector.update(score)
        # After a cut ADWIN keeps the newer part only, so its estimate rose when the stream's did.
        return bool(self.detector.drift_detected) and self.detector.estimation > before

    def why(self) -> str:
        return (
            f"adwin: the newest {int(self.detector.width)} chunk(s) score {self.detector.estimation:.1f} "
            f"standard errors on average, above the chunks before them (delta {ADWIN_DELTA:g})"
        )
