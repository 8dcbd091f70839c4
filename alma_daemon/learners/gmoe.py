"""gMoE: a growing mixture of experts (paper section 4.2, appendix A, Algorithm 2).

The first two layers of the backbone (the MLP's hidden layers, or VGG's first two blocks) are
tree-gated mixtures of experts (:mod:`alma_daemon.models.moe`); the model starts as SM, with one
expert per layer. A growth step computes, on the validation data, each expert's cumulative loss
(the losses of the examples routed through it, weighted by its gating value with soft gating) and
splits, at each mixture layer, the losing expert: the one with the largest cumulative loss.

When to grow: Algorithm 2 grows after training on a stage, on that stage's validation data. The
engine calls :meth:`grow` before training instead (:mod:`~alma_daemon.learners.growing`: not before
the first stage has trained), on the new stage's validation data. The error series is the same,
since a split keeps the function, but two things differ from Algorithm 2: after stage k the model
holds one split per layer fewer, and the losing expert is chosen on the next stage's validation
data, not the last one's.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from alma_daemon.config.base import ConfigError
from alma_daemon.data.datasets import TaskInfo
from alma_daemon.data.tensors import LabeledData
from alma_daemon.learners.base import SingleNetwork, network_layers, seeded_build
from alma_daemon.learners.configs import GrowingMixtureOfExpertsConfig
from alma_daemon.learners.growing import GrowsOnceTrained
from alma_daemon.learners.growth_report import GrowthReport
from alma_daemon.models.backbones import Backbone, Normalize
from alma_daemon.models.moe import LEAF, TreeGatedMoE, binary_gate, count_experts
from alma_daemon.training.flops import count_flops
from alma_daemon.training.loop import EVAL_BATCH, Trainer
from alma_daemon.training.losses import TaskLoss

#: Backbone layers that are mixtures of experts (paper section 5: "at the first two layers").
MIXTURE_LAYERS = 2


def layer_input_sizes(task: TaskInfo, layers: list[nn.Module], count: int) -> list[int]:
    """Number of values per example entering each of the first ``count`` layers (a gate's input size)."""
    sizes = []
    with torch.no_grad():
        z = Normalize(task)(torch.zeros(1, *task.input_shape))
        for layer in layers[:count]:
            sizes.append(z[0].numel())
            z = layer.eval()(z)
            layer.train()
    return sizes


def routed_forward(net: Backbone, x: torch.Tensor) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """The network's raw outputs (logits) and, for every mixture layer, the gating value of each expert for each example."""
    z, weights = net.normalize(x), []
    for layer in net.layers:
        if isinstance(layer, TreeGatedMoE):
            w = layer.leaf_weights(z)
            weights.append(w)
            z = layer.mix(z, w)
        else:
            z = layer(z)
    return z, weights


def cumulative_losses(net: Backbone, data: LabeledData, task_loss: TaskLoss) -> list[torch.Tensor]:
    """Per mixture layer, each expert's summed loss on ``data`` (the task's training loss: class-weighted
    cross-entropy, or a regression's error), weighted by its gating value."""
    net.eval()
    totals: list[torch.Tensor] = []
    with torch.inference_mode():
        for i in range(0, len(data), EVAL_BATCH):
            logits, weights = routed_forward(net, data.x[i : i + EVAL_BATCH])
            loss = task_loss.per_example(logits, data.y[i : i + EVAL_BATCH])
            batch = [w.T @ loss for w in weights]
            totals = batch if not totals else [t + b for t, b in zip(totals, batch)]
    return totals


class GrowingMixtureOfExperts(GrowsOnceTrained, SingleNetwork):
    """SM whose first two layers are tree-gated mixtures that split their losing expert at each growth step.

    ``arch``: ``{"trees": [gating tree per mixture layer], "trained": whether a stage has trained}``.
    """

    name = "gmoe"
    #: A step splits one expert per mixture layer, so every layer holds as many: the cap is per layer.
    size_cap_key = "max_experts"
    #: Splitting an expert leaves the loss unchanged (Algorithm 2): the copies differ only once trained.
    growth_keeps_function = True
    config_model = GrowingMixtureOfExpertsConfig
    model: Backbone
    config: GrowingMixtureOfExpertsConfig

    @classmethod
    def contract_cases(cls) -> list[tuple[str, dict[str, Any]]]:
        return [("mlp", {}), ("vgg", {"width": 4}), ("mlp", {"gating": "hard"}), ("regression", {})]

    def initial_architecture(self) -> dict[str, Any]:
        return {"trees": [LEAF] * MIXTURE_LAYERS, "trained": False}

    def build(self, arch: dict[str, Any]) -> nn.Module:
        layers = self.mixable_layers()
        sizes = layer_input_sizes(self.task, layers, MIXTURE_LAYERS)
        for i, tree in enumerate(arch["trees"]):
            experts = [layers[i]] + [network_layers(self.task, self.config)[i] for _ in range(count_experts(tree) - 1)]
            gates = [binary_gate(sizes[i]) for _ in range(count_experts(tree) - 1)]
            layers[i] = TreeGatedMoE(experts, gates, tree, self.config.gating == "hard", sizes[i])
        return Backbone(self.task, layers)

    def mixable_layers(self) -> list[nn.Module]:
        """The network's layers, the first :data:`MIXTURE_LAYERS` of which hold parameters to mix.

        A ``learner.model`` factory's ``nn.Sequential`` gives its children: group each hidden layer
        with its activation (``nn.Sequential(nn.Linear(d, h), nn.ReLU())``) so that they are layers.
        """
        layers = network_layers(self.task, self.config)
        flat = [i for i, layer in enumerate(layers[: MIXTURE_LAYERS + 1]) if not any(True for _ in layer.parameters())]
        if len(layers) <= MIXTURE_LAYERS or flat:
            raise ConfigError(
                f"learner.model: gmoe makes the first {MIXTURE_LAYERS} layers of the factory's nn.Sequential mixtures "
                f"of experts and needs a layer after them, each with parameters; got {len(layers)} layers"
                + (f", layer {flat[0]} ({type(layers[flat[0]]).__name__}) without parameters" if flat else "")
                + ": group each hidden layer with its activation, e.g. nn.Sequential(nn.Linear(d, h), nn.ReLU())"
            )
        return layers

    def mixtures(self) -> list[TreeGatedMoE]:
        return [layer for layer in self.model.layers if isinstance(layer, TreeGatedMoE)]

    def grown_size(self) -> int:
        return max(len(m.experts) for m in self.mixtures())

    def growth_skipped(self) -> dict[str, Any]:
        return {"split": []}

    def grow_trained(self, val: LabeledData, trainer: Trainer) -> GrowthReport:
        """Split the losing expert of every mixture layer."""
        val = LabeledData(val.x.to(self.device), val.y.to(self.device))
        task_loss = self.training_loss
        losses, flops = count_flops(lambda: cumulative_losses(self.model, val, task_loss))
        splits = []
        for i, (mixture, loss) in enumerate(zip(self.mixtures(), losses)):
            losing = int(loss.argmax())
            seed = int(torch.randint(0, 2**62, (1,), generator=trainer.generator("gmoe-gate", i)))
            gate = seeded_build(seed, lambda: binary_gate(mixture.input_size)).to(self.device)
            new = mixture.split(losing, gate)
            splits.append(
                {
                    "layer": i,
                    "losing_expert": losing,
                    "new_expert": new,
                    "cumulative_loss": [round(float(v), 4) for v in loss],
                }
            )
        self.arch = {"trees": [m.tree for m in self.mixtures()], "trained": True}
        return GrowthReport({"split": splits, "experts": [len(m.experts) for m in self.mixtures()]}, flops=flops)
