"""Policy registry: ``policy.name`` in config maps to a class, one module per policy.

The policies by name come from the entry points of group ``alma_daemon.policies`` (pyproject.toml).
"""

from __future__ import annotations

from typing import cast

from alma_daemon.config import PolicyConfig
from alma_daemon.registry import POLICIES, Registry
from policies.base import Decision, Policy, PolicyState

_POLICIES = cast("Registry[type[Policy]]", POLICIES)


def policy_names() -> list[str]:
    return _POLICIES.names()


def policy_config_models() -> dict[str, type[PolicyConfig]]:
    """Each policy's config model by name: the ``policy`` section is their union, discriminated by name."""
    return {name: policy.config_model for name, policy in _POLICIES.items()}


def build_policy(config: PolicyConfig) -> Policy:
    return _POLICIES[config.name](config)


__all__ = [
    "POLICIES",
    "Decision",
    "Policy",
    "PolicyState",
    "build_policy",
    "policy_config_models",
    "policy_names",
]
