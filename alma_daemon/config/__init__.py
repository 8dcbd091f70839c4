"""Typed, validated configuration: pydantic models, one per section, and one per learner and per policy.

``base`` holds the building blocks (strict value types, errors naming the dotted key), ``sections`` the
sections and the whole :class:`Config`, ``plugins`` the ``learner`` and ``policy`` sections (each learner
and policy declares its own model in its module), ``loading`` YAML files, ``--set`` overrides and the
JSON Schema (``alma config schema``), ``registry`` the registries of every kind of plugin, fed by entry points.
"""

from alma_daemon.config.base import ConfigError, validate
from alma_daemon.config.loading import (
    build_config,
    json_schema,
    load_config,
    parse_override,
    read_yaml,
    set_dotted,
    to_dict,
)
from alma_daemon.config.plugins import LearnerConfig, PolicyConfig, learner_config, policy_config
from alma_daemon.config.sections import (
    Config,
    DaemonConfig,
    DatasetConfig,
    DriftConfig,
    KafkaConfig,
    MetricsConfig,
    RedisConfig,
    ReferenceConfig,
    ServingConfig,
    StreamConfig,
    TaskConfig,
    TrainConfig,
)

__all__ = [
    "Config",
    "ConfigError",
    "DaemonConfig",
    "DatasetConfig",
    "DriftConfig",
    "KafkaConfig",
    "LearnerConfig",
    "MetricsConfig",
    "PolicyConfig",
    "RedisConfig",
    "ReferenceConfig",
    "ServingConfig",
    "StreamConfig",
    "TaskConfig",
    "TrainConfig",
    "build_config",
    "validate",
    "json_schema",
    "learner_config",
    "load_config",
    "parse_override",
    "policy_config",
    "read_yaml",
    "set_dotted",
    "to_dict",
]
