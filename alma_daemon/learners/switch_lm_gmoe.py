"""gMoE for language modeling (paper section 5): grow the flat mixture by copying the worst experts.

At each growth, in every block, the ``learner.grow_experts`` experts whose routed validation tokens
carry the largest summed loss (their contribution to the total loss, as in section 4.2) are copied,
expert FFN and router row, with :meth:`SwitchFFN.split_experts`, which leaves the model's function
unchanged until training separates the copies. A growth before the first training stage does
nothing: the paper's gMoE has E experts at t0, E + k at t1, ... The FLOPs of the validation pass
that ranks the experts are charged to the stage's training FLOPs by the engine.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from alma_daemon.data.tensors import LabeledData
from alma_daemon.learners import register_learner
from alma_daemon.learners.switch_lm import LM_EVAL_BATCH, SwitchLanguageModel
from alma_daemon.models.switch import SwitchLM
from alma_daemon.training.flops import count_flops
from alma_daemon.training.loop import FitReport, Trainer


def expert_losses(net: SwitchLM, val: LabeledData, device: torch.device) -> list[torch.Tensor]:
    """Per block, the summed next-token loss of the validation tokens routed to each expert."""
    net.eval()
    totals = [torch.zeros(len(block.ffn.experts), device=device) for block in net.blocks]
    with torch.inference_mode():
        for i in range(0, len(val), LM_EVAL_BATCH):
            x, y = val.x[i : i + LM_EVAL_BATCH].to(device), val.y[i : i + LM_EVAL_BATCH].to(device)
            out = net(x)
            loss = F.cross_entropy(out.logits.flatten(0, 1), y.flatten(), reduction="none")
            for total, route in zip(totals, out.routes):
                total.index_add_(0, route, loss)  # evaluation has no capacity limit: every route is >= 0
    return totals


@register_learner
class GrowingSwitchLM(SwitchLanguageModel):
    """A Switch LM whose blocks gain ``learner.grow_experts`` copied experts per growth."""

    name = "switch-lm-gmoe"
    grows = True

    def initial_architecture(self) -> dict:
        return {"experts": [self.config.experts] * self.config.layers, "trained": False}

    def build(self, arch: dict) -> nn.Module:
        return self.new_network(arch["experts"])

    def fit(self, train: LabeledData, val: LabeledData, trainer: Trainer) -> FitReport:
        report = super().fit(train, val, trainer)
        self.arch["trained"] = True
        return report

    def grow(self, val: LabeledData, trainer: Trainer) -> dict:
        if not self.arch["trained"]:
            return {"copied": [], "experts": list(self.arch["experts"]), "reason": "not trained yet"}
        losses, flops = count_flops(lambda: expert_losses(self.model, val, self.device))
        copied = []
        for block, loss in zip(self.model.blocks, losses):
            chosen = loss.topk(min(self.config.grow_experts, len(loss))).indices.tolist()
            block.ffn.split_experts(chosen)
            copied.append(chosen)
        self.arch["experts"] = [len(block.ffn.experts) for block in self.model.blocks]
        return {"copied": copied, "experts": list(self.arch["experts"]), "flops": flops}

    def reinitialize(self, seed: int) -> None:
        self.arch["trained"] = False
        super().reinitialize(seed)
