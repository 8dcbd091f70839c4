"""Parts of a long-lived process that start and stop, run as a graph: each starts after the parts it
requires and stops before them.

Celery's worker bootsteps are the model: a part is a small :class:`Component` with ``start`` and
``stop`` that names the parts it needs (``requires``); a :class:`ComponentGraph` orders them, starts
them in that order and stops the started ones in reverse. A start-up that fails half way stops what
it had started, and each stop runs on its own, so one failing (Redis being down, say) does not leave
a thread of another part running. Adding a part is adding a component.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from types import TracebackType
from typing import ClassVar, TypeVar

from alma_daemon.infra.outages import one_line

log = logging.getLogger(__name__)

T = TypeVar("T")


class NotStarted(RuntimeError):
    """A part's resource was asked for before the part started."""


def started(value: T | None, part: str) -> T:
    """``value``, which part ``part`` sets when it starts; :class:`NotStarted` while it has not."""
    if value is None:
        raise NotStarted(f"the {part} part has not started")
    return value


class Component:
    """One part: :meth:`start` opens what it holds (a connection, a thread, a lock), :meth:`stop` closes it.

    A start that raises must leave nothing open: the graph does not stop the part whose start
    failed, only the ones started before it.
    """

    #: The part's name, which other parts' ``requires`` and the shutdown log use.
    name: ClassVar[str]
    #: The names of the parts that must have started before this one (and stop after it).
    requires: ClassVar[tuple[str, ...]] = ()

    def start(self) -> None:
        pass

    def stop(self) -> None:
        pass


class ComponentGraph:
    """Starts its components in dependency order and stops the started ones in reverse."""

    def __init__(self, components: Iterable[Component]):
        #: The components in the order they start.
        self.order = start_order(components)
        self._started: list[Component] = []

    def start(self) -> None:
        """Start every component; if one fails, stop those already started and raise its error."""
        for component in self.order:
            try:
                component.start()
            except BaseException:
                self.stop()
                raise
            self._started.append(component)

    def stop(self) -> None:
        """Stop the started components, last started first, each on its own: a stop that fails is
        logged and the others still run."""
        while self._started:
            component = self._started.pop()
            try:
                component.stop()
            except Exception as exc:
                log.warning("shutdown step failed", extra={"step": component.name, "error": one_line(exc)})

    def __enter__(self) -> ComponentGraph:
        self.start()
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, traceback: TracebackType | None
    ) -> None:
        self.stop()


def start_order(components: Iterable[Component]) -> list[Component]:
    """The components in an order where each comes after those it requires; among the ones free to
    go next, the first listed goes first, so a list that already respects ``requires`` is kept."""
    pending = list(components)
    names = [component.name for component in pending]
    duplicates = sorted({name for name in names if names.count(name) > 1})
    if duplicates:
        raise ValueError(f"two components are named {duplicates[0]!r}")
    for component in pending:
        unknown = [name for name in component.requires if name not in names]
        if unknown:
            raise ValueError(f"component {component.name!r} requires {unknown[0]!r}, which is not in the graph")
    order: list[Component] = []
    placed: set[str] = set()
    while pending:
        free = next((c for c in pending if placed.issuperset(c.requires)), None)
        if free is None:
            raise ValueError(
                f"components {', '.join(c.name for c in pending)} cannot start: their requires form a cycle"
            )
        order.append(free)
        placed.add(free.name)
        pending.remove(free)
    return order
