"""The ``learner`` and ``policy`` sections: each learner and each policy declares its own config model.

A learner's config model (the built-ins' in ``learners/configs.py``: ``SingleModelConfig``)
subclasses :class:`LearnerConfig`, narrows ``name`` to the learner's name and adds the keys it reads; the
learner's entry point (group ``alma_daemon.learners``, :mod:`alma_daemon.registry`) names it. The section is the union of those models,
discriminated by ``name``, so a key the chosen learner does not read fails at start-up. Policies alike.
"""

from __future__ import annotations

from typing import Annotated, Any, cast

from pydantic import BeforeValidator, Field
from pydantic.dataclasses import dataclass

from alma_daemon.config.base import PLUGIN_SECTION, Float, Int, PluginConfig, Str, UnionSchema, validate
from alma_daemon.registry import LEARNERS, POLICIES


@dataclass(config=PLUGIN_SECTION)
class LearnerConfig(PluginConfig):
    """Keys every learner has; each learner's model adds its own."""

    name: Str = Field(
        default="sm",
        description="The learner: {learners}.",
    )

    section = "learner"
    default_name = "sm"

    @classmethod
    def registered(cls) -> dict[str, type[PluginConfig]]:
        return LEARNERS.declarations()


@dataclass(config=PLUGIN_SECTION)
class PolicyConfig(PluginConfig):
    """Keys every waiting-time policy has; each policy's model adds its own."""

    name: Str = Field(
        default="fixed",
        description="The waiting-time policy: {policies} (docs/policies.md).",
    )
    grow_every: Int = Field(
        default=1, ge=0, description="Growing learners grow every k-th training stage (1 = every stage, 0 = never)."
    )
    max_model_age_chunks: Int | None = Field(
        default=None,
        gt=0,
        description="The freshness bound in chunks: a stage is forced once this many chunks arrived since the last "
        "stage, whatever the policy would wait for (the reason says so). None = no bound in chunks.",
    )
    max_model_age_examples: Int | None = Field(
        default=None,
        gt=0,
        description="The freshness bound in examples: a stage is forced once this many examples arrived since the last "
        "stage (the pending ones), whatever the policy would wait for: a bound that means the same whatever a chunk "
        'holds (docs/policies.md, "One default for a team"). None = no bound in examples.',
    )
    max_model_age_seconds: Float | None = Field(
        default=86400.0,
        gt=0,
        description="The freshness bound in seconds: a stage is forced once the last stage is this old and a chunk "
        "waits (checked on each chunk and between chunks). 86400 = a day, the nightly retrain teams run by default. "
        "None = no bound in time.",
    )

    section = "policy"
    default_name = "fixed"

    @classmethod
    def registered(cls) -> dict[str, type[PluginConfig]]:
        return {name: policy.config_model for name, policy in POLICIES.items()}

    def check_stream_length(self, megabatches: int) -> None:
        """Raise a ConfigError if this policy would never train on a stream that ends after
        ``megabatches`` chunks (a simulated one; a live stream may go on, so ``alma run`` does not ask).
        Only a wait counted in chunks can outlast a stream: geometric and adaptive train on the first
        chunk, schedule and budget on the clock."""


#: The ``learner`` and ``policy`` fields of the whole config: the named plugin's model.
LearnerSection = Annotated[LearnerConfig, BeforeValidator(LearnerConfig.choose), UnionSchema(LearnerConfig)]
PolicySection = Annotated[PolicyConfig, BeforeValidator(PolicyConfig.choose), UnionSchema(PolicyConfig)]


def learner_config(data: dict[str, Any] | None = None, **values: Any) -> LearnerConfig:
    """The ``learner`` section from ``data`` and keyword ``values`` (``name`` picks the learner; default sm)."""
    return cast(LearnerConfig, validate(LearnerConfig, {**(data or {}), **values}, prefix="learner."))


def policy_config(data: dict[str, Any] | None = None, **values: Any) -> PolicyConfig:
    """The ``policy`` section from ``data`` and keyword ``values`` (``name`` picks the policy; default fixed)."""
    return cast(PolicyConfig, validate(PolicyConfig, {**(data or {}), **values}, prefix="policy."))


#: The placeholders a description writes for the registered plugins' names, and their kinds.
PLUGIN_NAME_LISTS = {"{learners}": "learner", "{policies}": "policy"}


def with_plugin_names(description: str) -> str:
    """``description`` with each placeholder of :data:`PLUGIN_NAME_LISTS` replaced by the names the
    registry holds, so a description never lists plugins by hand (and never misses a new one)."""
    registries = {"learner": LEARNERS, "policy": POLICIES}
    for placeholder, kind in PLUGIN_NAME_LISTS.items():
        if placeholder in description:
            description = description.replace(placeholder, ", ".join(registries[kind].names()))
    return description
