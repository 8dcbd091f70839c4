"""FF: Firefly neural architecture descent (Wu et al. 2020), growing width and depth (paper section 4.2).

A growth step looks at a neighbourhood of the current network and keeps the candidates that
decrease the loss most:

- *split* unit i of a layer: incoming weights ``w +/- delta``, outgoing weights halved; the loss
  changes to second order in ``delta`` (splitting steepest descent, Liu et al. 2019);
- *new* unit: incoming weights ``u``, outgoing weights ``step * o``; first order in the step;
- *new layer* after a hidden layer: a square layer initialized to ``identity + delta``.

Every candidate takes a step that changes the function by about the same small amount: a
relative size (of the weights it perturbs) of :data:`STEP` for the first-order candidates, and of
:data:`SPLIT_STEP` = sqrt(:data:`STEP`) for splits, whose effect is second order. Its direction
(``delta``, or ``u`` and ``o``) starts random and is optimized by a few gradient steps on the
estimated loss decrease ``-<dL/dt, change of t>``, where ``t`` is the tensor the candidate
changes and the gradient is the current network's. Width candidates are kept greedily by estimated
decrease until the step has added ``learner.growth_rate`` times the *initial* parameter count
(linear growth, paper appendix B.1); a new layer is inserted (at most one per step) when its
estimated decrease beats that of the width candidates its parameters would otherwise buy. The
network then takes exactly the steps that were scored, so its function barely changes.

Data: the engine hands :meth:`Learner.grow` the new stage's validation set only, so candidates are
scored on (a subsample of) it, as gMoE scores its experts.

When to grow: as every growing learner, once the newest part has trained (:mod:`~alma_daemon.learners.growing`),
and while a unit fits under ``learner.max_parameters``; a step near the cap spends only the room left.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, cast

import torch
import torch.nn.functional as F
from torch import nn

from alma_daemon.config import LearnerConfig
from alma_daemon.data.datasets import TaskInfo
from alma_daemon.data.tensors import LabeledData
from alma_daemon.learners.base import SingleNetwork
from alma_daemon.learners.configs import FireflyConfig, refuse_cap_without_room
from alma_daemon.learners.growing import GrowsOnceTrained
from alma_daemon.learners.growth_report import GrowthReport
from alma_daemon.models.backbones import is_image_task
from alma_daemon.models.firefly_net import (
    GrowableLayer,
    GrowableNet,
    apply_op,
    grown_architecture,
    initial_architecture,
    parameter_count,
)
from alma_daemon.training.flops import count_flops
from alma_daemon.training.loop import Trainer
from alma_daemon.training.losses import TaskLoss

#: Size of every candidate's step, relative to the norm of the weights it perturbs (Firefly's epsilon).
STEP = 0.001
SPLIT_STEP = STEP**0.5
#: Validation examples the candidates are scored on; a conv layer sees every position of an image as
#: a sample, so fewer images suffice (and keep a VGG growth step to about an epoch's compute).
SCORING_EXAMPLES = 512
SCORING_IMAGES = 64
#: Gradient steps (Adam) that optimize the candidates' directions, and their learning rate.
DIRECTION_STEPS = 10
DIRECTION_LR = 0.1


@dataclass
class LayerTrace:
    """A hidden layer's tensors on the scoring data, and the loss gradient with respect to them."""

    z: torch.Tensor  # input
    pre: torch.Tensor  # op (+ BatchNorm) output, before the ReLU
    out: torch.Tensor  # output (after the ReLU and the pool)
    grad_h: torch.Tensor  # dL/d ReLU output (before the pool)
    grad_out: torch.Tensor  # dL/d output
    grad_next: torch.Tensor  # dL/d consumer's op output (the next layer's, or the logits)


@dataclass
class Candidate:
    """A way to grow: split or add a unit of hidden layer ``layer``, or insert a layer after it."""

    kind: str  # "split", "new" or "layer"
    layer: int
    index: int  # the unit split, or the new-unit candidate; 0 for a layer
    gain: float  # estimated decrease of the loss


@dataclass
class Directions:
    """The optimized steps of one hidden layer's candidates, ready to apply."""

    split_delta: torch.Tensor  # units x row: perturbation of each unit's incoming weights
    new_rows: torch.Tensor  # candidates x row: new units' incoming weights
    new_columns: torch.Tensor  # consumer outputs x candidates (x kernel): their outgoing weights
    new_stats: tuple[torch.Tensor, torch.Tensor] | None  # conv: mean, variance of their op outputs
    layer_delta: torch.Tensor  # width x width (x kernel): perturbation of an inserted identity layer


def per_unit(v: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """Broadcast a per-unit vector over a (N, units, ...) activation tensor."""
    return v.view(1, -1, *[1] * (like.dim() - 2))


def unit_sums(t: torch.Tensor) -> torch.Tensor:
    return t.transpose(0, 1).flatten(1).sum(1)


def unit_rows(w: torch.Tensor) -> torch.Tensor:
    """Each unit's incoming weights (dim 0) scaled to norm 1."""
    return w / w.flatten(1).norm(dim=1).clamp_min(1e-12).view(-1, *[1] * (w.dim() - 1))


def unit_columns(w: torch.Tensor) -> torch.Tensor:
    """Each unit's outgoing weights (dim 1) scaled to norm 1."""
    return unit_rows(w.transpose(0, 1)).transpose(0, 1)


def pad_inputs(rows: torch.Tensor, fan_in: int) -> torch.Tensor:
    """Rows over a layer's inputs, extended with zero weights on inputs added since they were made."""
    return torch.cat([rows, rows.new_zeros(rows.shape[0], fan_in - rows.shape[1], *rows.shape[2:])], 1)


def ascend(objective: Callable[[], torch.Tensor], directions: list[torch.Tensor]) -> None:
    optimizer = torch.optim.Adam(directions, lr=DIRECTION_LR)
    for _ in range(DIRECTION_STEPS):
        optimizer.zero_grad()
        (-objective()).backward()
        optimizer.step()


def trace(net: GrowableNet, x: torch.Tensor, y: torch.Tensor, task_loss: TaskLoss) -> tuple[list[LayerTrace], float]:
    """Every hidden layer's :class:`LayerTrace` (test-time BatchNorm), and the task's training loss."""
    net.eval()
    z, kept = net.stem(x), []
    for i in range(len(net.hidden)):
        layer = net.layer(i)
        a = layer.op(z)
        pre = layer.norm(a)
        h = F.relu(pre)
        out = layer.pool(h)
        kept.append((z, a, pre, h, out))
        z = out
    logits = net.classifier(z.flatten(1))
    loss = task_loss.mean_loss(logits, y)
    wrt = [t for _, a, _, h, out in kept for t in (a, h, out)] + [logits]
    grads = torch.autograd.grad(loss, wrt)
    traces = []
    for i, (z, _, pre, _, out) in enumerate(kept):
        grad_a_next = grads[3 * (i + 1)] if i + 1 < len(kept) else grads[-1]
        grad_h, grad_out = grads[3 * i + 1], grads[3 * i + 2]
        traces.append(LayerTrace(z.detach(), pre.detach(), out.detach(), grad_h, grad_out, grad_a_next))
    return traces, float(loss.detach())


def random_direction(shape: tuple[int, ...], generator: torch.Generator, device: torch.device) -> torch.Tensor:
    return torch.randn(shape, generator=generator).to(device).requires_grad_()


def norm_scale(layer: GrowableLayer) -> torch.Tensor:
    """Per-unit factor of the test-time BatchNorm (1 without one): how a change of the op output shows."""
    if isinstance(layer.norm, nn.BatchNorm2d):
        assert layer.norm.running_var is not None  # the layer's BatchNorm tracks running statistics
        return (layer.norm.weight / (layer.norm.running_var + layer.norm.eps).sqrt()).detach()
    return torch.ones(layer.width, device=layer.op.weight.device)


def split_candidates(layer: GrowableLayer, t: LayerTrace, g: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """Each unit's split step ``delta`` and the loss decrease (second order) its split would give."""
    weight = layer.op.weight.detach()
    size = SPLIT_STEP * weight.flatten(1).norm(dim=1)
    direction = random_direction(tuple(weight.shape), g, weight.device)

    def gains() -> torch.Tensor:
        delta = apply_op(layer.op, t.z, unit_rows(direction)) * per_unit(size * norm_scale(layer), t.pre)
        change = (F.relu(t.pre + delta) + F.relu(t.pre - delta)) / 2 - F.relu(t.pre)
        return -unit_sums(t.grad_h * change)

    ascend(lambda: gains().sum(), [direction])
    with torch.no_grad():
        return unit_rows(direction) * size.view(-1, *[1] * (weight.dim() - 1)), gains()


def new_unit_candidates(net: GrowableNet, index: int, t: LayerTrace, count: int, g: torch.Generator) -> tuple[Any, ...]:
    """Incoming and outgoing weights of ``count`` new units for a layer, and each one's loss decrease."""
    layer, consumer = net.layer(index), net.consumer(index)
    weight, out_weight = layer.op.weight.detach(), consumer.weight.detach()
    in_size = weight.flatten(1).norm(dim=1).mean()
    out_size = STEP * out_weight.transpose(0, 1).flatten(1).norm(dim=1).mean()
    rows = random_direction((count, *weight.shape[1:]), g, weight.device)
    columns = random_direction((out_weight.shape[0], count, *out_weight.shape[2:]), g, weight.device)
    conv = isinstance(layer.op, nn.Conv2d)

    def features() -> tuple[torch.Tensor, tuple[Any, ...] | None]:
        c = apply_op(layer.op, t.z, unit_rows(rows) * in_size)
        if not conv:
            return layer.pool(F.relu(c)), None
        assert isinstance(layer.norm, nn.BatchNorm2d)  # a conv layer has one
        mean, var = c.mean((0, 2, 3)), c.var((0, 2, 3), unbiased=False)
        c = (c - per_unit(mean, c)) / per_unit((var + layer.norm.eps).sqrt(), c)  # a fresh BatchNorm
        return layer.pool(F.relu(c)), (mean, var)

    def decrease(gate: torch.Tensor) -> torch.Tensor:
        q = features()[0]
        return -(t.grad_next * apply_op(consumer, q * per_unit(gate, q), unit_columns(columns) * out_size)).sum()

    ones = torch.ones(count, device=weight.device)
    ascend(lambda: decrease(ones), [rows, columns])
    gate = ones.clone().requires_grad_()
    # The decrease is linear in each unit's gate, so its gradient is each unit's own decrease.
    gains = torch.autograd.grad(decrease(gate), gate)[0]
    with torch.no_grad():
        stats = features()[1]
        return unit_rows(rows) * in_size, unit_columns(columns) * out_size, stats, gains


def layer_candidate(layer: GrowableLayer, t: LayerTrace, g: torch.Generator) -> tuple[torch.Tensor, float]:
    """The perturbation of a layer inserted after ``layer`` (identity + delta) and its loss decrease."""
    w = layer.width
    shape = (w, w, 3, 3) if isinstance(layer.op, nn.Conv2d) else (w, w)
    direction = random_direction(shape, g, layer.op.weight.device)

    def decrease() -> torch.Tensor:
        change = F.relu(t.out + STEP * apply_op(layer.op, t.out, unit_rows(direction))) - t.out
        return -(t.grad_out * change).sum()

    ascend(decrease, [direction])
    with torch.no_grad():
        return STEP * unit_rows(direction), float(decrease())


def propose(
    net: GrowableNet, traces: list[LayerTrace], budget: float, g: torch.Generator
) -> tuple[list[Directions], list[Candidate]]:
    """Optimize every candidate's direction; return them per layer with the scored candidates.

    Each layer gets enough new-unit candidates to spend the whole budget on its own (at least as
    many as it has units), so that no way of growing is ruled out by a short list.
    """
    directions, candidates = [], []
    for i, t in enumerate(traces):
        layer = net.layer(i)
        unit_cost = sum(p[0].numel() for p in layer.parameters()) + net.consumer(i).weight[:, 0].numel()
        count = max(layer.width, math.ceil(budget / unit_cost))
        split_delta, split_gains = split_candidates(layer, t, g)
        rows, columns, stats, new_gains = new_unit_candidates(net, i, t, count, g)
        layer_delta, layer_gain = layer_candidate(layer, t, g)
        directions.append(Directions(split_delta, rows, columns, stats, layer_delta))
        candidates += [Candidate("split", i, u, float(v)) for u, v in enumerate(split_gains)]
        candidates += [Candidate("new", i, u, float(v)) for u, v in enumerate(new_gains)]
        candidates.append(Candidate("layer", i, 0, layer_gain))
    return directions, candidates


#: ``count(added units per layer, inserted_after)``: the parameters of the network grown that way.
Pricing = Callable[[Counter[int], int | None], int]


def fill(candidates: list[Candidate], budget: float, price: Callable[[Counter[int]], int]) -> list[Candidate] | None:
    """Greedily, the width candidates with the largest positive gains whose parameters fit in ``budget``.

    ``price(added)`` is the number of parameters the step adds; it counts the weights between
    units added to adjacent layers, and the growth of a new layer inserted after a widened one.
    None when nothing fits (a new layer alone may not).
    """
    chosen: list[Candidate] = []
    added: Counter[int] = Counter()
    if price(added) > budget:
        return None
    for c in sorted(candidates, key=lambda c: -c.gain):
        added[c.layer] += 1
        if c.gain > 0 and price(added) <= budget:
            chosen.append(c)
        else:
            added[c.layer] -= 1
    return chosen


def select(candidates: list[Candidate], budget: float, count: Pricing) -> list[Candidate]:
    """Width candidates filling the budget, or one new layer plus those filling the rest if that gains more."""
    now = count(Counter(), None)
    width = [c for c in candidates if c.kind != "layer"]
    options = [fill(width, budget, lambda added: count(added, None) - now)]
    for layer in (c for c in candidates if c.kind == "layer" and c.gain > 0):
        rest = fill(width, budget, lambda added: count(added, layer.layer) - now)
        options.append(None if rest is None else [layer, *rest])
    return max((o for o in options if o is not None), key=lambda option: sum(c.gain for c in option))


@torch.no_grad()
def apply(net: GrowableNet, chosen: list[Candidate], directions: list[Directions], x: torch.Tensor) -> None:
    """Take the chosen steps: width first (layer by layer), then the new layer, if any."""
    for i, d in enumerate(directions):
        fan_in = net.layer(i).op.weight.shape[1]
        splits = [c.index for c in chosen if c.kind == "split" and c.layer == i]
        if splits:
            net.split_units(i, torch.tensor(splits), pad_inputs(d.split_delta[splits], fan_in))
        new = [c.index for c in chosen if c.kind == "new" and c.layer == i]
        if new:
            stats = (d.new_stats[0][new], d.new_stats[1][new]) if d.new_stats else None
            net.add_new_units(i, pad_inputs(d.new_rows[new], fan_in), d.new_columns[:, new], stats)
    for c in chosen:
        if c.kind == "layer":
            insert_layer(net, c.layer, directions[c.layer].layer_delta, x)


def insert_layer(net: GrowableNet, index: int, delta: torch.Tensor, x: torch.Tensor) -> None:
    """Insert ``identity + delta`` after hidden layer ``index`` (grown units pass through unperturbed)."""
    weight = net.identity_weight(index)
    weight[: delta.shape[0], : delta.shape[1]] += delta
    net.eval()
    z = net.stem(x)
    for layer in net.hidden[: index + 1]:
        z = layer(z)
    y = apply_op(net.layer(index).op, z, weight)
    stats = (y.mean((0, 2, 3)), y.var((0, 2, 3), unbiased=False)) if y.dim() == 4 else None
    net.insert_layer(index, weight, stats)


def firefly_step(
    net: GrowableNet, task: TaskInfo, data: LabeledData, budget: float, g: torch.Generator, task_loss: TaskLoss
) -> dict[str, Any]:
    """One growth step of about ``budget`` parameters on ``data``, scored on ``task_loss``; returns a JSON summary."""
    before = sum(p.numel() for p in net.parameters())
    traces, loss_before = trace(net, data.x, data.y, task_loss)
    directions, candidates = propose(net, traces, budget, g)
    arch = net.architecture()
    chosen = select(candidates, budget, lambda added, at: parameter_count(task, grown_architecture(arch, added, at)))
    apply(net, chosen, directions, data.x)
    with torch.no_grad():
        net.eval()
        loss_after = float(task_loss.mean_loss(net(data.x), data.y))
    per_layer = [Counter(c.layer for c in chosen if c.kind == kind) for kind in ("split", "new")]
    return {
        "split": [per_layer[0][i] for i in range(len(traces))],
        "new": [per_layer[1][i] for i in range(len(traces))],
        "inserted_after": next((c.layer for c in chosen if c.kind == "layer"), None),
        "parameters_added": sum(p.numel() for p in net.parameters()) - before,
        "budget": round(budget),
        "estimated_decrease": sum(c.gain for c in chosen),
        "loss_before": loss_before,
        "loss_after": loss_after,
    }


class Firefly(GrowsOnceTrained, SingleNetwork):
    """The SM backbone grown by Firefly steps, each adding about ``growth_rate`` x its initial parameters.

    ``arch``: the :class:`GrowableNet` architecture plus ``"trained"`` (whether a stage has trained).
    """

    name = "firefly"
    #: Firefly grows by a parameter budget, so its cap counts parameters.
    size_cap_key = "max_parameters"
    #: Every candidate is a small, scored step (STEP): the function barely changes.
    growth_keeps_function = True
    config_model = FireflyConfig
    model: GrowableNet
    config: FireflyConfig

    def initial_architecture(self) -> dict[str, Any]:
        return {**initial_architecture(self.task, self.config.width), "trained": False}

    def build(self, arch: dict[str, Any]) -> nn.Module:
        return GrowableNet(self.task, arch)

    def __init__(self, task: TaskInfo, config: LearnerConfig, seed: int, arch: dict[str, Any] | None = None):
        firefly = cast(FireflyConfig, config)
        start = parameter_count(task, initial_architecture(task, firefly.width))
        refuse_cap_without_room("max_parameters", firefly.max_parameters, start, "parameters")
        super().__init__(task, config, seed, arch)

    def grown_size(self) -> int:
        return self.num_parameters()

    def smallest_growth(self) -> int:
        """The parameters of the cheapest unit any hidden layer could gain."""
        now = self.num_parameters()
        return min(
            parameter_count(self.task, grown_architecture(self.arch, {i: 1})) - now
            for i in range(len(self.arch["widths"]))
        )

    def growth_skipped(self) -> dict[str, Any]:
        return {"parameters_added": 0}

    def grow_trained(self, val: LabeledData, trainer: Trainer) -> GrowthReport:
        """One Firefly step on a subsample of ``val``, of ``growth_rate`` x the initial parameters or what
        room the cap leaves, whichever is less."""
        limit = SCORING_IMAGES if is_image_task(self.task) else SCORING_EXAMPLES
        pick = torch.randperm(len(val), generator=trainer.generator("firefly", "subsample"))[:limit]
        data = LabeledData(val.x[pick].to(self.device), val.y[pick].to(self.device))
        initial = parameter_count(self.task, initial_architecture(self.task, self.config.width))
        room = self.room_to_grow()
        budget = self.config.growth_rate * initial if room is None else min(self.config.growth_rate * initial, room)
        directions = trainer.generator("firefly", "directions")
        loss = self.training_loss
        summary, flops = count_flops(lambda: firefly_step(self.model, self.task, data, budget, directions, loss))
        self.arch = {**self.model.architecture(), "trained": True}
        return GrowthReport(summary, flops=flops)
