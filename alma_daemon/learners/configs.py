"""The built-in learners' config sections (``learner.*``), apart from the learners themselves.

A learner's module imports torch, and reading a config should not: ``alma config check`` answers in
about half a second instead of three. So the config model of each built-in learner lives here, and
each names its learner in ``implementation``; the learner names it back as its ``config_model``. The
entry points of group ``alma_daemon.learners`` (pyproject.toml) name these models, so the config layer
finds them without importing a learner. A learner of another package may keep its model in its own module.
"""

from __future__ import annotations

from typing import ClassVar, Literal

from pydantic import Field
from pydantic.dataclasses import dataclass

from alma_daemon.config import LearnerConfig
from alma_daemon.config.base import PLUGIN_SECTION, ConfigError, Float, Int, Str


def refuse_cap_without_room(key: str, cap: int | None, start: int, unit: str) -> None:
    """A size cap must leave room to grow: one at or below the size the learner starts at never lets it
    grow, which is the non-growing learner's job (sm, switch-lm)."""
    if cap is not None and cap <= start:
        raise ConfigError(
            f"learner.{key}: {cap} is not above the {start} {unit} the learner starts with, so it could never "
            f"grow; set a larger cap, or none (unbounded)"
        )


@dataclass(config=PLUGIN_SECTION)
class BackboneConfig(LearnerConfig):
    """Keys of the learners built from the image backbones (MLP, reduced VGG19-BN)."""

    width: Int = Field(
        default=64,
        gt=0,
        description="Hidden units (MLP) or channels (VGG) of every layer of the backbone (unused with learner.model).",
    )
    model: Str | None = Field(
        default=None,
        description="A team's own network instead of the paper's backbone: 'package.module:factory', a function of "
        "the task returning a torch.nn.Module from a batch of inputs to logits, imported from an installed package "
        "or the working directory (docs/your-model.md). Every member is built from it, each from its own seed.",
    )
    init_weights: Str | None = Field(
        default=None,
        description="Start the stream from the deployed model: a .safetensors file of learner.model's state dict "
        "(every member of sm, ens and umix starts from it; gens's first member), or a version's weights.safetensors "
        "in a model store (the live one: alma status names it) of the same learner. None = random weights. Ignored "
        "when the daemon resumes from a checkpoint.",
    )


@dataclass(config=PLUGIN_SECTION)
class SingleModelConfig(BackboneConfig):
    """sm reads only the backbone's width."""

    name: Literal["sm"] = "sm"
    implementation: ClassVar[str] = "alma_daemon.learners.sm:SingleModel"


@dataclass(config=PLUGIN_SECTION)
class EnsembleConfig(BackboneConfig):
    """Ens: the backbone's width and the number of members."""

    name: Literal["ens"] = "ens"
    implementation: ClassVar[str] = "alma_daemon.learners.ens:Ensemble"
    members: Int = Field(default=5, gt=0, description="Independent backbones, each initialized from its own seed.")


@dataclass(config=PLUGIN_SECTION)
class UniformMixtureConfig(BackboneConfig):
    """UMix: the backbone's width and the number of members."""

    name: Literal["umix"] = "umix"
    implementation: ClassVar[str] = "alma_daemon.learners.umix:UniformMixture"
    members: Int = Field(default=5, gt=0, description="Backbones whose averaged logits are trained end to end.")


MAX_MEMBERS = (
    "Members at which growth stops: a growth step adds no more than fit under it (fewer than grow_members), "
    "and at it a growth step is skipped, saying so, and stages fine-tune the newest members, so parameters "
    "and inference FLOPs stay constant. None = unbounded (the paper). Must be above 1, the member it starts with."
)


@dataclass(config=PLUGIN_SECTION)
class GrowingEnsembleConfig(BackboneConfig):
    """gEns: the backbone's width, the members added per growth step and their cap."""

    name: Literal["gens"] = "gens"
    implementation: ClassVar[str] = "alma_daemon.learners.gens:GrowingEnsemble"
    grow_members: Int = Field(default=1, gt=0, description="Members added per growth step (k).")
    max_members: Int | None = Field(default=None, description=MAX_MEMBERS)

    def __post_init__(self) -> None:
        refuse_cap_without_room("max_members", self.max_members, 1, "member")


@dataclass(config=PLUGIN_SECTION)
class GrowingMixtureOfExpertsConfig(BackboneConfig):
    """gMoE: the backbone's width, how the experts are gated and their cap."""

    name: Literal["gmoe"] = "gmoe"
    implementation: ClassVar[str] = "alma_daemon.learners.gmoe:GrowingMixtureOfExperts"
    gating: Literal["soft", "hard"] = Field(
        default="soft",
        description='"soft" (softmax gates) or "hard" (straight-through in training, argmax at test time).',
    )
    max_experts: Int | None = Field(
        default=None,
        description="Experts per mixture layer at which growth stops: from then on a growth step is skipped, "
        "saying so, and stages fine-tune, so parameters and inference FLOPs stay constant. None = unbounded "
        "(the paper). Must be above 1, the expert each layer starts with.",
    )

    def __post_init__(self) -> None:
        refuse_cap_without_room("max_experts", self.max_experts, 1, "expert per mixture layer")
        if self.init_weights is not None:
            raise ConfigError(
                "learner.init_weights: gmoe's first layers are mixtures of experts, which a deployed model's "
                "weights do not fit; start sm, ens, umix or gens from them"
            )


@dataclass(config=PLUGIN_SECTION)
class FireflyConfig(BackboneConfig):
    """Firefly: the backbone's (initial) width, how much each growth step adds and the parameters' cap."""

    name: Literal["firefly"] = "firefly"
    implementation: ClassVar[str] = "alma_daemon.learners.firefly:Firefly"

    def __post_init__(self) -> None:
        if self.model is not None:
            raise ConfigError(
                "learner.model: firefly grows the paper's MLP and VGG by splitting and adding units inside their "
                "layers, which it cannot do to a module it did not build; use sm, ens, umix, gens or gmoe"
            )

    growth_rate: Float = Field(
        default=0.25,
        ge=0,
        description="Parameters added per growth step as a share of the initial count (linear growth).",
    )
    max_parameters: Int | None = Field(
        default=None,
        gt=0,
        description="Parameters at which growth stops: a growth step adds no more than fit under it, and once "
        "no unit fits a growth step is skipped, saying so, and stages fine-tune, so parameters and inference "
        "FLOPs stay constant. None = unbounded (the paper). Must be above the initial count (checked when the "
        "learner is built: it depends on the task's inputs).",
    )


@dataclass(config=PLUGIN_SECTION)
class LanguageModelConfig(LearnerConfig):
    """Keys of every Switch LM learner: the size of one Switch Transformer LM (Fedus et al. 2021)."""

    experts: Int = Field(default=4, gt=0, description="Experts per Switch layer.")
    layers: Int = Field(default=2, gt=0, description="Transformer blocks.")
    d_model: Int = Field(default=128, gt=0, description="Model width.")
    heads: Int = Field(default=4, gt=0, description="Attention heads.")
    d_ff: Int = Field(default=512, gt=0, description="Expert FFN width.")
    dropout: Float = Field(default=0.1, ge=0, description="Dropout rate.")
    capacity_factor: Float = Field(
        default=1.0, gt=0, description="Tokens over an expert's capacity skip the FFN through the residual."
    )
    balance_loss_weight: Float = Field(default=0.01, ge=0, description="Weight of the load-balancing loss.")


@dataclass(config=PLUGIN_SECTION)
class SwitchLanguageModelConfig(LanguageModelConfig):
    """switch-lm reads only the LM's size."""

    name: Literal["switch-lm"] = "switch-lm"
    implementation: ClassVar[str] = "alma_daemon.learners.switch_lm:SwitchLanguageModel"


@dataclass(config=PLUGIN_SECTION)
class SwitchLMEnsembleConfig(LanguageModelConfig):
    """switch-lm-ens: the size of each LM and the number of members."""

    name: Literal["switch-lm-ens"] = "switch-lm-ens"
    implementation: ClassVar[str] = "alma_daemon.learners.switch_lm_ens:SwitchLMEnsemble"
    members: Int = Field(default=5, gt=0, description="Switch LMs, each initialized from its own seed.")


@dataclass(config=PLUGIN_SECTION)
class GrowingSwitchLMEnsembleConfig(LanguageModelConfig):
    """switch-lm-gens: the size of each LM, the members added per growth step and their cap."""

    name: Literal["switch-lm-gens"] = "switch-lm-gens"
    implementation: ClassVar[str] = "alma_daemon.learners.switch_lm_gens:GrowingSwitchLMEnsemble"
    grow_members: Int = Field(default=1, gt=0, description="Members added per growth step.")
    max_members: Int | None = Field(default=None, description=MAX_MEMBERS)

    def __post_init__(self) -> None:
        refuse_cap_without_room("max_members", self.max_members, 1, "member")


@dataclass(config=PLUGIN_SECTION)
class GrowingSwitchLMConfig(LanguageModelConfig):
    """switch-lm-gmoe: the LM's initial size, the experts copied per growth step and their cap."""

    name: Literal["switch-lm-gmoe"] = "switch-lm-gmoe"
    implementation: ClassVar[str] = "alma_daemon.learners.switch_lm_gmoe:GrowingSwitchLM"
    grow_experts: Int = Field(default=2, gt=0, description="Experts copied per growth step (top-k by validation loss).")
    max_experts: Int | None = Field(
        default=None,
        description="Experts per Switch layer at which growth stops: a growth step copies no more than fit under "
        "it, and at it a growth step is skipped, saying so, and stages fine-tune, so parameters and inference "
        "FLOPs stay constant. None = unbounded. Must be above learner.experts, the count each layer starts with.",
    )

    def __post_init__(self) -> None:
        refuse_cap_without_room("max_experts", self.max_experts, self.experts, "experts per Switch layer")
