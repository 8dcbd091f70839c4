"""The one way to plug something in: a registry per kind of plugin, fed by entry points.

Each kind (learners, policies, measures, publishers, codecs, sources, commands) is an entry point group;
each entry point names one plugin: its name is the plugin's name (``learner.name: sm``), its value the
object (``package.module:attr``). The built-ins are declared in pyproject.toml like any other package's
plugins, so the names come from installed metadata without importing a plugin: ``alma --help`` and
``alma config check`` import no torch, and no list of names is kept beside the registry.

Where the plugin object imports torch and the config must know it without (a learner's config model, a
measure's direction), the entry point names a light *declaration* instead, whose ``implementation``
(``module:attr``) names the object; the object points back at its declaration (``declared_as``), and
loading it checks that the two agree.
"""

from __future__ import annotations

import functools
import pkgutil
import sys
from collections.abc import Iterator, Mapping
from importlib.metadata import EntryPoint, PackageNotFoundError, distribution, entry_points
from typing import Any, Generic, TypeVar

T = TypeVar("T")


@functools.cache
def _require_installed() -> None:
    """One line where alma-daemon runs from a source folder it was never installed from: without its metadata
    no registry knows a plugin, and every lookup would fail naming none."""
    try:
        distribution("alma-daemon")
    except PackageNotFoundError:
        raise RuntimeError(
            f"alma-daemon is not installed in {sys.executable}'s environment, so no plugin is known: "
            "run `pip install -e .` in the repository (or `bash scripts/setup.sh`)"
        ) from None


@functools.cache
def _installed_entry_points() -> Any:
    # One scan of the installed metadata for all seven kinds (each scan reads every distribution). Python
    # 3.12 returns EntryPoints, 3.10 and 3.11 SelectableGroups: both select by group.
    return entry_points()


class Registry(Mapping[str, T], Generic[T]):
    """The plugins of one kind by name: read from entry point group ``group``, each loaded on first use.

    A read-only mapping: ``registry[name]`` is the plugin (a KeyError naming the known ones for another
    name); iterating gives the names without importing a plugin; ``items()`` imports every one.

    ``declared_as``: the attribute by which a plugin loaded through a declaration names that declaration
    (``config_model``, ``traits``). :meth:`register` adds a plugin in a running process (a test, a notebook).
    """

    def __init__(self, kind: str, group: str, declared_as: str | None = None):
        #: The kind's name in messages ("learner", "policy").
        self.kind = kind
        self.group = group
        self.declared_as = declared_as
        self._entries: dict[str, Any] | None = None
        self._loaded: dict[str, T] = {}

    @property
    def entries(self) -> dict[str, Any]:
        """Name -> its entry point, or the declaration once loaded, by name (the installed metadata keeps no
        order)."""
        if self._entries is None:
            _require_installed()
            entries: dict[str, Any] = {}
            for entry in _installed_entry_points().select(group=self.group):
                if entry.name in entries and entries[entry.name].value != entry.value:
                    raise ValueError(
                        f"{self.kind} {entry.name!r} is declared twice: {entries[entry.name].value} and {entry.value}"
                    )
                entries.setdefault(entry.name, entry)
            self._entries = entries
        return self._entries

    def names(self) -> list[str]:
        return list(self.entries)

    def __contains__(self, name: object) -> bool:
        return name in self.entries

    def __iter__(self) -> Iterator[str]:
        return iter(self.names())

    def __len__(self) -> int:
        return len(self.entries)

    def declaration(self, name: str) -> Any:
        """What ``name``'s entry point names (the plugin itself, or its declaration), imported on first use."""
        if name not in self.entries:
            raise KeyError(f"unknown {self.kind} {name!r}; known: {', '.join(self.names())}")
        entry = self.entries[name]
        if isinstance(entry, EntryPoint):
            entry = self.entries[name] = self._named(name, entry.load())
        return entry

    def _named(self, name: str, plugin: Any) -> Any:
        """``plugin``, refused where it calls itself by another name than the one it is registered under."""
        own = getattr(plugin, "name", name)
        if isinstance(own, str) and own != name:
            raise ValueError(f"{self.kind} {name!r}: {plugin!r} calls itself {own!r}")
        return plugin

    def __getitem__(self, name: str) -> T:
        declaration = self.declaration(name)
        path = getattr(declaration, "implementation", None)
        if not isinstance(path, str):
            return declaration  # type: ignore[no-any-return]
        loaded = self._loaded.get(name)
        if loaded is None:
            loaded = self._named(name, pkgutil.resolve_name(path))
            if self.declared_as is not None and getattr(loaded, self.declared_as, None) is not declaration:
                raise TypeError(
                    f"{self.kind} {name!r}: {path}.{self.declared_as} is not {declaration!r}, "
                    "the declaration its entry point names"
                )
            self._loaded[name] = loaded  # only once checked: a plugin refused once is refused every time
        return loaded

    def declarations(self) -> dict[str, Any]:
        """Each plugin's declaration by name (light: imports no implementation)."""
        return {name: self.declaration(name) for name in self.names()}

    def register(self, name: str, plugin: Any) -> None:
        """Add ``plugin`` (or its declaration) under ``name`` in this process."""
        if name in self.entries:
            raise ValueError(f"{self.kind} name {name!r} registered twice")
        self.entries[name] = self._named(name, plugin)

    def unregister(self, name: str) -> None:
        self.entries.pop(name)
        self._loaded.pop(name, None)


#: Every kind of plugin, by the entry point group that feeds it (CONTRIBUTING.md, "Adding a plugin").
LEARNERS: Registry[Any] = Registry("learner", "alma_daemon.learners", declared_as="config_model")
POLICIES: Registry[Any] = Registry("policy", "alma_daemon.policies")
MEASURES: Registry[Any] = Registry("measure", "alma_daemon.measures", declared_as="traits")
PUBLISHERS: Registry[Any] = Registry("publisher", "alma_daemon.publishers")
CODECS: Registry[Any] = Registry("codec", "alma_daemon.codecs")
SOURCES: Registry[Any] = Registry("source", "alma_daemon.sources")
COMMANDS: Registry[Any] = Registry("command", "alma_daemon.commands")
