"""A tree-gated mixture of experts (paper appendix A), the layer that gMoE grows.

The experts are the leaves of a binary tree of gates; an expert's gating value is the product of
the gate probabilities on its root-to-leaf path, so the values of all experts sum to one. The tree
is plain JSON, saved in the learner's spec: a leaf is ``{"expert": i}``, an internal node is
``{"gate": j, "children": [left, right]}``, where ``i`` and ``j`` index :attr:`TreeGatedMoE.experts`
and :attr:`TreeGatedMoE.gates`.

Hard gating routes each example down the tree: at every gate it samples a child in training (with
a straight-through gradient, Bengio et al. 2013) and takes the more probable child at test time.
Test-time routing follows the tree rather than taking the global argmax of the leaf values: when a
split halves a leaf's value the global argmax may jump to another expert, whereas a descent of the
tree still reaches one of the two identical children, so a split never changes the function.
"""

from __future__ import annotations

import copy
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from alma_daemon.models.noise import DrawsNoise

LEAF = {"expert": 0}


def count_experts(tree: dict[str, Any]) -> int:
    return 1 if "expert" in tree else sum(count_experts(child) for child in tree["children"])


def split_leaf(tree: dict[str, Any], expert: int, gate: int, new_expert: int) -> dict[str, Any]:
    """A copy of ``tree`` whose leaf ``expert`` became gate ``gate`` over ``expert`` and ``new_expert``."""
    if "expert" in tree:
        if tree["expert"] != expert:
            return dict(tree)
        return {"gate": gate, "children": [{"expert": expert}, {"expert": new_expert}]}
    return {"gate": tree["gate"], "children": [split_leaf(c, expert, gate, new_expert) for c in tree["children"]]}


def binary_gate(input_size: int) -> nn.Module:
    """A gate: a linear map of the flattened layer input to the logits of its two children."""
    return nn.Sequential(nn.Flatten(), nn.Linear(input_size, 2))


class TreeGatedMoE(DrawsNoise):
    """``f(z) = sum_e g(e|z) h(z|e)`` over the leaves ``e`` of a binary gating tree (soft or hard).

    Hard gating samples each gate's choice in training from ``self.generator`` (see
    :mod:`alma_daemon.models.noise`)."""

    def __init__(
        self, experts: list[nn.Module], gates: list[nn.Module], tree: dict[str, Any], hard: bool, input_size: int
    ):
        super().__init__()
        if count_experts(tree) != len(experts):
            raise ValueError(f"tree has {count_experts(tree)} leaves but {len(experts)} experts were given")
        self.experts = nn.ModuleList(experts)
        self.gates = nn.ModuleList(gates)
        self.tree = tree
        self.hard = hard
        #: Values per example entering the layer: the input size of its gates.
        self.input_size = input_size

    @property
    def draws_noise(self) -> bool:
        return self.hard

    def forward(self, z: torch.Tensor) -> torch.Tensor:
        return self.mix(z, self.leaf_weights(z))

    def leaf_weights(self, z: torch.Tensor) -> torch.Tensor:
        """Gating value of every expert for every example (N x experts); one-hot with hard gating."""
        choices = [self._choose(gate(z).softmax(1)) for gate in self.gates]
        weights: dict[int, torch.Tensor] = {}
        stack = [(self.tree, z.new_ones(len(z)))]
        while stack:
            node, mass = stack.pop()
            if "expert" in node:
                weights[node["expert"]] = mass
                continue
            choice = choices[node["gate"]]
            stack.extend((child, mass * choice[:, k]) for k, child in enumerate(node["children"]))
        return torch.stack([weights[e] for e in range(len(self.experts))], 1)

    def _choose(self, p: torch.Tensor) -> torch.Tensor:
        if not self.hard:
            return p
        if self.training:
            sample = F.one_hot(torch.multinomial(p, 1, generator=self.generator).squeeze(1), 2).to(p.dtype)
            return sample + (p - p.detach())  # forward: exactly the sample; backward: as if soft
        return F.one_hot(p.argmax(1), 2).to(p.dtype)

    def mix(self, z: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
        """The experts' outputs weighted by ``weights``.

        Hard gating at test time runs one expert per example; in training it runs them all, as the
        straight-through gradient reaches every gate through every expert's output.
        """
        if self.hard and not self.training:
            return self._route(z, weights.argmax(1))
        outputs = torch.stack([expert(z) for expert in self.experts], 1)
        return (weights.view(*weights.shape, *[1] * (outputs.dim() - 2)) * outputs).sum(1)

    def _route(self, z: torch.Tensor, choice: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor | None = None
        for e, expert in enumerate(self.experts):
            rows = (choice == e).nonzero().squeeze(1)
            if len(rows):
                h = expert(z[rows])
                out = h.new_empty(len(z), *h.shape[1:]) if out is None else out
                out[rows] = h
        return self.experts[0](z) if out is None else out  # an empty batch has no route

    def split(self, expert: int, gate: nn.Module) -> int:
        """Split ``expert`` into two copies (parameters and BatchNorm statistics) under the new ``gate``.

        Returns the new expert's index. The copies are identical, so the layer's function is unchanged.
        """
        new_expert = len(self.experts)
        self.experts.append(copy.deepcopy(self.experts[expert]))
        self.gates.append(gate)
        self.tree = split_leaf(self.tree, expert, len(self.gates) - 1, new_expert)
        return new_expert
