"""A registry of one kind of plugin (learners, policies): the ``name`` in config maps to a class.

A plugin module registers its class with the kind's decorator. The built-in modules are imported on
the first lookup, not when the registry is made, so that each of them can import the registry
without an import cycle.
"""

from __future__ import annotations

import importlib
from typing import Any, ClassVar, Generic, Protocol, TypeVar


class Plugin(Protocol):
    """What the registry reads from a plugin class: its name and the config model of its section."""

    name: ClassVar[str]
    config_model: ClassVar[type[Any]]


PluginT = TypeVar("PluginT", bound=Plugin)


class PluginRegistry(Generic[PluginT]):
    """The classes of one kind of plugin by name, with the built-in modules that register them."""

    def __init__(self, kind: str, package: str, builtin_modules: list[str]):
        #: The kind's name in messages ("learner", "policy").
        self.kind = kind
        self.package = package
        self.builtin_modules = builtin_modules
        self.classes: dict[str, type[PluginT]] = {}

    def register(self, cls: type[PluginT]) -> type[PluginT]:
        """Add ``cls`` under ``cls.name``; its ``config_model`` must narrow ``name`` to that name."""
        if cls.name in self.classes:
            raise ValueError(f"{self.kind} name {cls.name!r} registered twice")
        if cls.config_model.__dataclass_fields__["name"].default != cls.name:
            raise ValueError(f"{self.kind} {cls.name!r}: its config_model must narrow name to Literal[{cls.name!r}]")
        self.classes[cls.name] = cls
        return cls

    def get(self, name: str) -> type[PluginT]:
        self.import_builtins()
        if name not in self.classes:
            raise KeyError(f"unknown {self.kind} {name!r}; known: {', '.join(sorted(self.classes))}")
        return self.classes[name]

    def names(self) -> list[str]:
        self.import_builtins()
        return sorted(self.classes)

    def config_models(self) -> dict[str, Any]:
        """Each plugin's config model by name (the section is their union, discriminated by name), the
        built-ins in the order of their modules' list, whatever imported them first, then the others."""
        self.import_builtins()
        modules = [f"{self.package}.{module}" for module in self.builtin_modules]

        def rank(name: str) -> int:
            module = self.classes[name].__module__
            return modules.index(module) if module in modules else len(modules)

        return {name: self.classes[name].config_model for name in sorted(self.classes, key=rank)}

    def import_builtins(self) -> None:
        for module in self.builtin_modules:
            importlib.import_module(f"{self.package}.{module}")
