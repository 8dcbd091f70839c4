"""gEns for language modeling: start as one Switch LM, add ``learner.grow_members`` per growth, train only new ones.

The first stage trains the first member; a growth before any member was trained adds nothing (the
paper's gEns has one member at t0, two at t1, ...). A stage without growth fine-tunes the members
added at the last growth (the newest ``grow_members``), as image gEns does, so every stage learns
from its data.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field
from pydantic.dataclasses import dataclass

from alma_daemon.config.base import PLUGIN_SECTION, Int
from alma_daemon.learners import register_learner
from alma_daemon.learners.growing_ensemble import GrowsByMembers
from alma_daemon.learners.switch_lm import LanguageModelConfig
from alma_daemon.learners.switch_lm_ens import SwitchLMEnsemble


@dataclass(config=PLUGIN_SECTION)
class GrowingSwitchLMEnsembleConfig(LanguageModelConfig):
    """switch-lm-gens: the size of each LM and the members added per growth step."""

    name: Literal["switch-lm-gens"] = "switch-lm-gens"
    grow_members: Int = Field(default=1, gt=0, description="Members added per growth step.")


@register_learner
class GrowingSwitchLMEnsemble(GrowsByMembers, SwitchLMEnsemble):
    """A Switch LM ensemble that grows by whole members.

    ``arch``: see :class:`~alma_daemon.learners.growing_ensemble.GrowsByMembers`.
    """

    name = "switch-lm-gens"
    config_model = GrowingSwitchLMEnsembleConfig
    config: GrowingSwitchLMEnsembleConfig
