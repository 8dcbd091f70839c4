"""Learner registry: ``learner.name`` in config maps to a class, one module per learner."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, cast

from alma_daemon.config import LearnerConfig
from alma_daemon.registry import LEARNERS, Registry

if TYPE_CHECKING:
    from alma_daemon.data.datasets import TaskInfo
    from alma_daemon.learners.base import Learner

#: The learners by name, from the entry points of group ``alma_daemon.learners`` (pyproject.toml): each names
#: the learner's config model (``learners/configs.py``), whose ``implementation`` names the class.
_LEARNERS = cast("Registry[type[Learner]]", LEARNERS)


def learner_class(name: str) -> type[Learner]:
    return _LEARNERS[name]


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
    """Each learner's config model by name, without importing a learner (and torch with it): the
    ``learner`` section is their union, discriminated by name."""
    return _LEARNERS.declarations()


def learner_names() -> list[str]:
    return _LEARNERS.names()


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
]
