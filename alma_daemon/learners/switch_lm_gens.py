"""gEns for language modeling: start as one Switch LM, add ``learner.grow_members`` per growth, train only new ones.

The first stage trains the first member; a growth before any member was trained adds nothing (the
paper's gEns has one member at t0, two at t1, ...). A stage without growth fine-tunes the members
added at the last growth (the newest ``grow_members``), as image gEns does, so every stage learns
from its data.
"""

from __future__ import annotations

from alma_daemon.learners.configs import GrowingSwitchLMEnsembleConfig
from alma_daemon.learners.growing_ensemble import GrowsByMembers
from alma_daemon.learners.switch_lm_ens import SwitchLMEnsemble


class GrowingSwitchLMEnsemble(GrowsByMembers, SwitchLMEnsemble):
    """A Switch LM ensemble that grows by whole members.

    ``arch``: see :class:`~alma_daemon.learners.growing_ensemble.GrowsByMembers`.
    """

    name = "switch-lm-gens"
    config_model = GrowingSwitchLMEnsembleConfig
    config: GrowingSwitchLMEnsembleConfig
