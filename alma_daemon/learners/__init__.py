"""Learner registry: ``learner.name`` in config maps to a class, one module per learner."""

from __future__ import annotations

from alma_daemon.config import LearnerConfig
from alma_daemon.data.datasets import TaskInfo
from alma_daemon.learners.base import Learner, config_from_spec

LEARNERS: dict[str, type[Learner]] = {}


def register_learner(cls: type[Learner]) -> type[Learner]:
    """Class decorator adding a learner to the registry under ``cls.name``, with its ``config_model``."""
    if cls.name in LEARNERS:
        raise ValueError(f"learner name {cls.name!r} registered twice")
    if cls.config_model.__dataclass_fields__["name"].default != cls.name:
        raise ValueError(f"learner {cls.name!r}: its config_model must narrow name to Literal[{cls.name!r}]")
    LEARNERS[cls.name] = cls
    return cls


def learner_class(name: str) -> type[Learner]:
    _import_builtin_learners()
    if name not in LEARNERS:
        raise KeyError(f"unknown learner {name!r}; known: {', '.join(sorted(LEARNERS))}")
    return LEARNERS[name]


def build_learner(name: str, task: TaskInfo, config: LearnerConfig, seed: int) -> Learner:
    return learner_class(name)(task, config, seed)


def learner_from_spec(spec: dict) -> Learner:
    """Rebuild the architecture described by a learner's ``spec()`` (weights are loaded separately)."""
    cls = learner_class(spec["learner"])
    task, config = config_from_spec(spec, cls.config_model)
    learner = cls(task, config, int(spec["seed"]), arch=spec["arch"])
    # Parts grown later draw from it: after a retraining from scratch it is no longer the seed.
    learner.build_seed = int(spec.get("build_seed", spec["seed"]))
    return learner


def learner_config_models() -> dict[str, type[LearnerConfig]]:
    """Each learner's config model by name: the ``learner`` section is their union, discriminated by name."""
    _import_builtin_learners()
    return {name: cls.config_model for name, cls in LEARNERS.items()}


def learner_names() -> list[str]:
    _import_builtin_learners()
    return sorted(LEARNERS)


def _import_builtin_learners() -> None:
    # Imported lazily so that each learner module can import this registry without a cycle.
    import importlib

    for module in BUILTIN_MODULES:
        importlib.import_module(f"alma_daemon.learners.{module}")


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
