"""Policy registry: ``policy.name`` in config maps to a class, one module per policy."""

from __future__ import annotations

import importlib

from alma_daemon.config import PolicyConfig
from policies.base import Decision, Policy, PolicyState

POLICIES: dict[str, type[Policy]] = {}

#: Modules whose import registers the built-in policies; add a line here for a new policy.
BUILTIN_MODULES: list[str] = ["fixed", "schedule", "budget", "geometric", "adaptive"]


def register_policy(cls: type[Policy]) -> type[Policy]:
    """Class decorator adding a policy to the registry under ``cls.name``, with its ``config_model``."""
    if cls.name in POLICIES:
        raise ValueError(f"policy name {cls.name!r} registered twice")
    if cls.config_model.__dataclass_fields__["name"].default != cls.name:
        raise ValueError(f"policy {cls.name!r}: its config_model must narrow name to Literal[{cls.name!r}]")
    POLICIES[cls.name] = cls
    return cls


def policy_names() -> list[str]:
    _import_builtin_policies()
    return sorted(POLICIES)


def policy_config_models() -> dict[str, type[PolicyConfig]]:
    """Each policy's config model by name: the ``policy`` section is their union, discriminated by name."""
    _import_builtin_policies()
    return {name: cls.config_model for name, cls in POLICIES.items()}


def build_policy(config: PolicyConfig) -> Policy:
    _import_builtin_policies()
    if config.name not in POLICIES:
        raise KeyError(f"unknown policy {config.name!r}; known: {', '.join(sorted(POLICIES))}")
    return POLICIES[config.name](config)


def _import_builtin_policies() -> None:
    for module in BUILTIN_MODULES:
        importlib.import_module(f"policies.{module}")


__all__ = [
    "POLICIES",
    "Decision",
    "Policy",
    "PolicyState",
    "build_policy",
    "policy_config_models",
    "policy_names",
    "register_policy",
]
