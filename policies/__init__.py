"""Policy registry: ``policy.name`` in config maps to a class, one module per policy."""

from __future__ import annotations

from alma_daemon.config import PolicyConfig
from alma_daemon.config.registry import PluginRegistry
from policies.base import Decision, Policy, PolicyState

#: Modules whose import registers the built-in policies; add a line here for a new policy.
BUILTIN_MODULES: list[str] = ["fixed", "schedule", "budget", "geometric", "adaptive", "forecast"]

_REGISTRY: PluginRegistry[Policy] = PluginRegistry("policy", __name__, BUILTIN_MODULES)
POLICIES = _REGISTRY.classes


def register_policy(cls: type[Policy]) -> type[Policy]:
    """Class decorator adding a policy to the registry under ``cls.name``, with its ``config_model``."""
    return _REGISTRY.register(cls)


def policy_names() -> list[str]:
    return _REGISTRY.names()


def policy_config_models() -> dict[str, type[PolicyConfig]]:
    """Each policy's config model by name: the ``policy`` section is their union, discriminated by name."""
    return _REGISTRY.config_models()


def build_policy(config: PolicyConfig) -> Policy:
    return _REGISTRY.get(config.name)(config)


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
