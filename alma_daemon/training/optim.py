"""Optimizers of the paper (appendix B), chosen by name or by the dataset's default."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence

import torch

from alma_daemon.config import TrainConfig

#: The paper's choice per dataset: MNIST AdaDelta, CIFAR-10 SGD with momentum, language models Adam.
DEFAULT_OPTIMIZER = {"mnist": "adadelta", "cifar10": "sgd", "ptb": "adam", "text": "adam"}
DEFAULT_LR = {"adadelta": 1.0, "sgd": 0.01, "adam": 1e-3}
DEFAULT_WEIGHT_DECAY = {"adadelta": 0.0, "sgd": 1e-4, "adam": 0.0}


def resolve_optimizer_name(config: TrainConfig, dataset: str) -> str:
    if config.optimizer != "auto":
        return config.optimizer
    return DEFAULT_OPTIMIZER.get(dataset, "adam")


def optimizer_factory(
    name: str, config: TrainConfig, device: torch.device
) -> Callable[[Sequence[torch.Tensor]], torch.optim.Optimizer]:
    """Builds the named optimizer over given tensors, in PyTorch's fastest exact form for ``device``.

    On the CPU the single-tensor or multi-tensor (``foreach``) kernels, which give the same results
    bit for bit (tests/test_training_loop.py checks); on CUDA the fused kernels where PyTorch has them
    (SGD, Adam), which round differently in the last bits, but a GPU run is not bit-reproducible anyway.
    """
    lr = config.lr if config.lr is not None else DEFAULT_LR[name]
    wd = config.weight_decay if config.weight_decay is not None else DEFAULT_WEIGHT_DECAY[name]

    def kernels(params: Sequence[torch.Tensor]) -> dict:
        if device.type == "cuda" and name in ("sgd", "adam"):
            return {"fused": True}
        # One tensor (a flat group) steps fastest on the single-tensor path, several on the multi-tensor one.
        return {"foreach": len(params) > 1}

    if name == "adadelta":
        return lambda params: torch.optim.Adadelta(params, lr=lr, weight_decay=wd, **kernels(params))
    if name == "sgd":
        return lambda params: torch.optim.SGD(
            params, lr=lr, momentum=config.momentum, weight_decay=wd, **kernels(params)
        )
    if name == "adam":
        return lambda params: torch.optim.Adam(
            params, lr=lr, betas=(0.9, 0.98), eps=1e-8, weight_decay=wd, **kernels(params)
        )
    raise ValueError(f"unknown optimizer {name!r}")


def build_optimizer(name: str, groups: Sequence[Iterable[torch.nn.Parameter]], config: TrainConfig) -> FlatOptimizer:
    """A fresh optimizer over each group of parameters, one flat tensor per group (see :class:`FlatOptimizer`).

    One per training stage, so parameters added by growth are included; frozen parameters
    (``requires_grad`` False) are left out.
    """
    trainable = [[p for p in group if p.requires_grad] for group in groups]
    device = next((p.device for group in trainable for p in group), torch.device("cpu"))
    return FlatOptimizer(trainable, optimizer_factory(name, config, device))


class FlatOptimizer:
    """A torch optimizer that steps each group of parameters as one flat tensor.

    AdaDelta, SGD and Adam are elementwise: a parameter's update does not depend on whether it is a
    tensor of its own or a slice of a bigger one, so the results are the per-parameter ones, bit for
    bit. What changes is the cost: about ten kernels per step instead of about ten per parameter
    tensor, which on small models is most of the optimizer's time. While it is in use, the
    parameters of a group are views into that group's buffer; :meth:`release` gives each its own
    storage back. Groups let several models share one optimizer (ensemble members trained as one
    batch): a group whose parameters got no gradient in a step is skipped, as PyTorch skips such a
    parameter. A step in which only some parameters of a group got one first splits every group into
    one per parameter, exact too, since until then every parameter of a group moved at every step.
    """

    def __init__(
        self,
        groups: Sequence[Sequence[torch.nn.Parameter]],
        build: Callable[[Sequence[torch.Tensor]], torch.optim.Optimizer],
    ):
        self.build = build
        self.groups = [list(group) for group in groups if group]
        self.flats = [_share_one_buffer(group) for group in self.groups]
        self.inner = build(self.flats)

    @property
    def param_groups(self) -> list[dict]:
        return self.inner.param_groups

    def zero_grad(self) -> None:
        for group in self.groups:
            for p in group:
                p.grad = None

    def step(self) -> None:
        present = [[p.grad is not None for p in group] for group in self.groups]
        if any(any(has) and not all(has) for has in present):
            self._split_per_parameter()
            present = [[p.grad is not None] for group in self.groups for p in group]
        for group, flat, has in zip(self.groups, self.flats, present):
            # has[0]: every parameter of the group has a gradient (mixed groups were split above).
            flat.grad = torch.cat([p.grad.reshape(-1) for p in group if p.grad is not None]) if has[0] else None
        self.inner.step()
        for flat in self.flats:
            flat.grad = None

    def release(self) -> None:
        """Every parameter back in a storage of its own (same values); the optimizer is done."""
        for group in self.groups:
            for p in group:
                p.data = p.data.clone()
        self.flats = []

    def _split_per_parameter(self) -> None:
        old_state, old_flats = self.inner.state, self.flats
        hyper = {k: v for k, v in self.inner.param_groups[0].items() if k != "params"}
        slices = []
        for group, flat in zip(self.groups, old_flats):
            offset = 0
            for p in group:
                slices.append((p, flat, offset))
                offset += p.numel()
        self.groups = [[p] for p, _, _ in slices]
        self.flats = [_share_one_buffer([p]) for p, _, _ in slices]
        self.inner = self.build(self.flats)
        self.inner.param_groups[0].update(hyper)
        for (p, flat, offset), new in zip(slices, self.flats):
            state = old_state.get(flat)
            if state:
                self.inner.state[new] = {
                    k: (
                        v[offset : offset + p.numel()].clone()
                        if torch.is_tensor(v) and v.shape == flat.shape
                        else v.clone()
                        if torch.is_tensor(v)
                        else v
                    )
                    for k, v in state.items()
                }


def _share_one_buffer(params: Sequence[torch.nn.Parameter]) -> torch.nn.Parameter:
    """One flat leaf tensor holding ``params``' values, each parameter becoming a view into it."""
    flat = torch.nn.Parameter(torch.cat([p.detach().reshape(-1) for p in params]))
    offset = 0
    for p in params:
        p.data = flat.detach()[offset : offset + p.numel()].view_as(p)
        offset += p.numel()
    return flat


class LinearWarmupDecay:
    """The LM schedule of appendix B.2: linear warm-up over ``warmup`` steps, then linear decay towards 0.

    Step ``s`` (0-based) runs at ``lr * (s + 1) / warmup`` during warm-up and ``lr * (steps - s) /
    (steps - warmup)`` after, so the last of ``steps`` steps still moves (at ``lr / (steps - warmup)``).
    Call :meth:`step` after each optimizer step; it sets ``lr`` in every parameter group the
    optimizer has at that moment.
    """

    def __init__(self, optimizer, steps: int, warmup: int):
        self.optimizer = optimizer
        self.steps = steps
        self.warmup = min(warmup, steps)
        self.base = [group["lr"] for group in optimizer.param_groups]
        self.done = 0
        self._apply()

    def factor(self, step: int) -> float:
        if step < self.warmup:
            return (step + 1) / self.warmup
        return max(0.0, (self.steps - step) / max(1, self.steps - self.warmup))

    def step(self) -> None:
        self.done += 1
        self._apply()

    def _apply(self) -> None:
        for group, base in zip(self.optimizer.param_groups, self.base):
            group["lr"] = base * self.factor(self.done)


def warmup_linear_decay(optimizer, steps: int, warmup: int) -> LinearWarmupDecay:
    return LinearWarmupDecay(optimizer, steps, warmup)
