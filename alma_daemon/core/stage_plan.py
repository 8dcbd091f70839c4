"""What a training stage trains on, and which chunks stay for replay: pure rules over chunk ids and sizes.

On an endless stream neither may grow with the stream. :class:`StagePlan` holds the rules the config
sets (``stream.replay``, ``stream.replay_keep``, ``stream.replay_examples``,
``train.max_stage_examples``, ``stream.seed``) and applies them to chunk ids and their example counts
only, so the simulator's ``MemoryBuffer`` and the daemon's ``RedisBuffer`` choose alike, and a
daemon restarted from the kept set alone chooses as an uninterrupted one (docs/service.md, "Bounded
data on an endless stream").

- :meth:`StagePlan.choose`: the newest pending chunks first, up to the stage cap; then, with replay,
  a sample of the kept chunks seeded by (seed, stage) fills what the cap leaves. Pending chunks beyond
  the cap are dropped untrained; a chunk alone larger than the cap is cut to ``cap`` examples.
- :meth:`StagePlan.replay_set`: after a stage, the chunks kept for replay (``KEEP_RULES``).

A chunk's examples are its training and validation examples, as stage records count them.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

from alma_daemon.config import Config
from alma_daemon.config.sections import StageRecipe

#: ``stream.replay_keep`` with replay; ``none`` without. ``classes`` keeps examples, not chunks: the
#: engine's class-aware reservoir (``core/example_reservoir.py``) holds them, so no chunk stays.
ReplayKeep = Literal["none", "all", "window", "reservoir", "classes"]


@dataclass(frozen=True)
class StageChoice:
    """The chunks one stage trains on (:meth:`StagePlan.choose`)."""

    #: Pending chunks the stage trains on.
    trained: tuple[int, ...]
    #: Pending chunks the stage cap leaves untrained: they are deleted with the stage.
    dropped: tuple[int, ...]
    #: Kept chunks the stage trains on again.
    replayed: tuple[int, ...]
    #: (chunk, examples): the one chunk of the stage, larger than the cap, cut to a seeded sample.
    cut: tuple[int, int] | None = None

    @property
    def chunks(self) -> tuple[int, ...]:
        """Every chunk the stage reads, in the order their examples are joined: ascending ids."""
        return tuple(sorted(self.trained + self.replayed))


@dataclass(frozen=True)
class StagePlan:
    """The replay set's rule and the stage cap, from the config (:meth:`from_config`)."""

    keep: ReplayKeep = "none"
    #: The examples a window or reservoir replay set holds at most.
    replay_examples: int | None = None
    #: The examples a stage trains on at most; None = no cap.
    max_stage_examples: int | None = None
    seed: int = 0

    def __post_init__(self) -> None:
        if self.keep not in KEEP_RULES:
            raise ValueError(f"replay keep {self.keep!r}: expected one of {sorted(KEEP_RULES)}")
        if self.keep in ("window", "reservoir") and self.replay_examples is None:
            raise ValueError(f"replay keep {self.keep} needs replay_examples")

    @classmethod
    def from_config(cls, config: Config, recipe: StageRecipe) -> StagePlan:
        """The plan of ``config`` with the replay rule of ``recipe`` (``StreamConfig.recipe``)."""
        return cls(
            keep=recipe.keep,  # type: ignore[arg-type]  # the recipe's rule is one of ReplayKeep
            replay_examples=recipe.replay_examples,
            max_stage_examples=config.train.max_stage_examples,
            seed=config.stream.seed,
        )

    def choose(
        self, stage: int, pending: Sequence[int], kept: Sequence[int], examples: Mapping[int, int]
    ) -> StageChoice:
        """What stage ``stage`` trains on, of the ``pending`` and ``kept`` chunks (``examples``: each
        one's size). Without a cap, every pending and every kept chunk."""
        cap = self.max_stage_examples
        if cap is None:
            return StageChoice(trained=tuple(sorted(pending)), dropped=(), replayed=tuple(sorted(kept)))
        newest_first = sorted(pending, reverse=True)
        trained = _prefix(newest_first, examples, cap)
        if newest_first and not trained:  # the newest chunk alone is larger than the cap
            newest = newest_first[0]
            return StageChoice((newest,), tuple(sorted(newest_first[1:])), (), cut=(newest, cap))
        dropped = tuple(sorted(newest_first[len(trained) :]))
        replay_order = sorted(kept, key=lambda chunk: _rank(self.seed, "replay", stage, chunk))
        replayed = _fill(replay_order, examples, cap - sum(examples[c] for c in trained))
        if not trained and not replayed and replay_order:  # nothing pending, each kept chunk larger than the cap
            return StageChoice((), (), (replay_order[0],), cut=(replay_order[0], cap))
        return StageChoice(tuple(sorted(trained)), dropped, tuple(sorted(replayed)))

    def replay_set(self, chunks: Iterable[int], examples: Mapping[int, int]) -> tuple[int, ...]:
        """The chunks of ``chunks`` (the kept ones and those a stage just trained) kept for replay,
        ascending. Each rule keeps a function of the set it is given, so a restart needs nothing but
        the kept set, and the simulator and the daemon, which both apply it stage by stage, keep alike.
        (With chunks of unequal sizes, stage by stage is not the same as once over every chunk: a small
        chunk may fill room that a larger one left.)"""
        return KEEP_RULES[self.keep](self, sorted(set(chunks)), examples)

    def after_stage(
        self, pending: Sequence[int], kept: Sequence[int], trained: Sequence[int], examples: Mapping[int, int]
    ) -> tuple[tuple[int, ...], tuple[int, ...]]:
        """(the replay set, the chunks no longer held) once a stage trained ``trained``: every pending
        chunk was trained or dropped, so nothing stays pending."""
        replay = self.replay_set([*kept, *trained], examples)
        return replay, tuple(sorted(set(pending).union(kept).difference(replay)))

    def stage_examples(self, pending_examples: int, kept_examples: int) -> int:
        """The examples the next stage trains on, about: the pending and kept ones, capped."""
        total = pending_examples + kept_examples
        return total if self.max_stage_examples is None else min(total, self.max_stage_examples)


def _keep_window(plan: StagePlan, chunks: list[int], examples: Mapping[int, int]) -> tuple[int, ...]:
    """The newest chunks (highest ids) whose examples total at most ``replay_examples``."""
    return tuple(sorted(_prefix(chunks[::-1], examples, _budget(plan))))


def _keep_reservoir(plan: StagePlan, chunks: list[int], examples: Mapping[int, int]) -> tuple[int, ...]:
    """A bottom-k sample: the chunks of lowest rank (a hash of (seed, chunk)) whose examples total at
    most ``replay_examples``; with chunks of one size, a uniform sample of the stream's chunks (with
    sizes that differ, the small ones are a little likelier to stay)."""
    order = sorted(chunks, key=lambda chunk: _rank(plan.seed, "reservoir", chunk))
    return tuple(sorted(_prefix(order, examples, _budget(plan))))


#: ``stream.replay_keep`` (``none`` without replay) -> the chunks it keeps of a stage's candidates.
KEEP_RULES: dict[str, Callable[[StagePlan, list[int], Mapping[int, int]], tuple[int, ...]]] = {
    "none": lambda plan, chunks, examples: (),
    "all": lambda plan, chunks, examples: tuple(chunks),
    "window": _keep_window,
    "reservoir": _keep_reservoir,
    "classes": lambda plan, chunks, examples: (),
}


def _budget(plan: StagePlan) -> int:
    assert plan.replay_examples is not None  # __post_init__
    return plan.replay_examples


def _prefix(order: Sequence[int], examples: Mapping[int, int], budget: int) -> list[int]:
    """The longest head of ``order`` whose examples total at most ``budget``."""
    taken, total = [], 0
    for chunk in order:
        total += examples[chunk]
        if total > budget:
            break
        taken.append(chunk)
    return taken


def _fill(order: Sequence[int], examples: Mapping[int, int], budget: int) -> list[int]:
    """The chunks of ``order`` taken in turn, each that still fits in ``budget``."""
    taken, room = [], budget
    for chunk in order:
        if examples[chunk] <= room:
            taken.append(chunk)
            room -= examples[chunk]
    return taken


def _rank(seed: int, *purpose: object) -> int:
    """A chunk's place in a seeded order: a hash of (seed, purpose), as ``seeding.derive_seed`` draws
    seeds, without importing torch."""
    text = "/".join([str(seed), *map(str, purpose)]).encode()
    return int.from_bytes(hashlib.sha256(text).digest()[:8], "little")
