"""gMoE for language modeling (paper section 5): grow the flat mixture by copying the worst experts.

At each growth, in every block, the ``learner.grow_experts`` experts whose routed validation tokens
carry the largest summed loss (their contribution to the total loss, as in section 4.2) are copied,
expert FFN and router row, with :meth:`SwitchFFN.split_experts`, which leaves the model's function
unchanged until training separates the copies. A growth before the first training stage does
nothing: the paper's gMoE has E experts at t0, E + k at t1, ... The FLOPs of the validation pass
that ranks the experts are charged to the stage's training FLOPs by the engine.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from alma_daemon.data.tensors import LabeledData
from alma_daemon.learners.configs import GrowingSwitchLMConfig
from alma_daemon.learners.growing import GrowsOnceTrained
from alma_daemon.learners.growth_report import GrowthReport
from alma_daemon.learners.switch_lm import LM_EVAL_BATCH, SwitchLanguageModel
from alma_daemon.models.switch import SwitchLM
from alma_daemon.training.flops import count_flops
from alma_daemon.training.loop import Trainer


def expert_losses(net: SwitchLM, val: LabeledData, device: torch.device) -> list[torch.Tensor]:
    """Per block, the summed next-token loss of the validation tokens routed to each expert."""
    net.eval()
    totals = [torch.zeros(len(ffn.experts), device=device) for ffn in net.switch_layers()]
    with torch.inference_mode():
        for i in range(0, len(val), LM_EVAL_BATCH):
            x, y = val.x[i : i + LM_EVAL_BATCH].to(device), val.y[i : i + LM_EVAL_BATCH].to(device)
            out = net(x)
            loss = F.cross_entropy(out.logits.flatten(0, 1), y.flatten(), reduction="none")
            for total, route in zip(totals, out.routes):
                total.index_add_(0, route, loss)  # evaluation has no capacity limit: every route is >= 0
    return totals


class GrowingSwitchLM(GrowsOnceTrained, SwitchLanguageModel):
    """A Switch LM whose blocks gain ``learner.grow_experts`` copied experts per growth, up to ``learner.max_experts``."""

    name = "switch-lm-gmoe"
    size_cap_key = "max_experts"
    #: Copied experts and router rows compute what the originals did until training separates them.
    growth_keeps_function = True
    config_model = GrowingSwitchLMConfig
    model: SwitchLM
    config: GrowingSwitchLMConfig

    def initial_architecture(self) -> dict[str, Any]:
        return {"experts": [self.config.experts] * self.config.layers, "trained": False}

    def build(self, arch: dict[str, Any]) -> nn.Module:
        return self.new_network(arch["experts"])

    def grown_size(self) -> int:
        return max(self.arch["experts"])

    def growth_skipped(self) -> dict[str, Any]:
        return {"copied": [], "experts": list(self.arch["experts"])}

    def grow_trained(self, val: LabeledData, trainer: Trainer) -> GrowthReport:
        losses, flops = count_flops(lambda: expert_losses(self.model, val, self.device))
        room = self.room_to_grow()
        copies = self.config.grow_experts if room is None else min(self.config.grow_experts, room)
        copied = []
        for ffn, loss in zip(self.model.switch_layers(), losses):
            chosen = loss.topk(min(copies, len(loss))).indices.tolist()
            ffn.split_experts(chosen)
            copied.append(chosen)
        self.arch = {**self.arch, "experts": [len(ffn.experts) for ffn in self.model.switch_layers()]}
        return GrowthReport({"copied": copied, "experts": list(self.arch["experts"])}, flops=flops)
