"""Learner registry: ``learner.name`` in config maps to a class, one module per learner."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from alma_daemon.config import LearnerConfig
from alma_daemon.config.registry import PluginRegistry

if TYPE_CHECKING:
    from alma_daemon.data.datasets import TaskInfo
    from alma_daemon.learners.base import Learner

#: Modules whose import registers the built-in learners; add a line here for a new learner.
BUILTIN_MODULES: list[str] = [
    "sm",
    "ens",
    "umix",
    "gens",
    "gmoe",
    "firefly",
    "switch_lm",
    "switch_lm_ens",
    "switch_lm_gens",
    "switch_lm_gmoe",
]

_REGISTRY: PluginRegistry[Learner] = PluginRegistry("learner", __name__, BUILTIN_MODULES)
LEARNERS = _REGISTRY.classes


def register_learner(cls: type[Learner]) -> type[Learner]:
    """Class decorator adding a learner to the registry under ``cls.name``, with its ``config_model``."""
    return _REGISTRY.register(cls)


def learner_class(name: str) -> type[Learner]:
    return _REGISTRY.get(name)


def build_learner(name: str, task: TaskInfo, config: LearnerConfig, seed: int) -> Learner:
    return learner_class(name)(task, config, seed)


def learner_from_spec(spec: dict[str, Any]) -> Learner:
    """Rebuild the architecture described by a learner's ``spec()`` (weights are loaded separately)."""
    from alma_daemon.learners.base import config_from_spec

    cls = learner_class(spec["learner"])
    task, config = config_from_spec(spec, cls.config_model)
    learner = cls(task, config, int(spec["seed"]), arch=spec["arch"])
    # Parts grown later draw from it: after a retraining from scratch it is no longer the seed.
    learner.build_seed = int(spec.get("build_seed", spec["seed"]))
    return learner


def learner_config_models() -> dict[str, type[LearnerConfig]]:
    """Each learner's config model by name: the ``learner`` section is their union, discriminated by name.

    The built-ins' come from ``learners/configs.py`` without importing the learners (and torch with
    them), so that reading a config stays light; then those of learners registered from elsewhere."""
    from alma_daemon.learners.configs import BUILTIN_CONFIGS

    return {**BUILTIN_CONFIGS, **{name: cls.config_model for name, cls in LEARNERS.items()}}


def learner_names() -> list[str]:
    return _REGISTRY.names()


def __getattr__(name: str) -> Any:
    # The learner interface is imported on first use, not with the package: the config reads its
    # learners' models through this package, and the interface imports torch.
    if name == "Learner":
        from alma_daemon.learners.base import Learner

        return Learner
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "LEARNERS",
    "Learner",
    "build_learner",
    "learner_class",
    "learner_config_models",
    "learner_from_spec",
    "learner_names",
    "register_learner",
]
