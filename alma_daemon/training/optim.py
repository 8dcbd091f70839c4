"""Optimizers of the paper (appendix B), chosen by name or by the dataset's default."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Any, Protocol

import torch

from alma_daemon.config import TrainConfig

#: The paper's choice per dataset: MNIST AdaDelta, CIFAR-10 SGD with momentum, language models Adam.
DEFAULT_OPTIMIZER = {"mnist": "adadelta", "cifar10": "sgd", "ptb": "adam", "text": "adam"}
DEFAULT_LR = {"adadelta": 1.0, "sgd": 0.01, "adam": 1e-3}
DEFAULT_WEIGHT_DECAY = {"adadelta": 0.0, "sgd": 1e-4, "adam": 0.0}
#: The rest: PyTorch's defaults, but Adam's betas (appendix B.2).
FIXED_HYPERPARAMETERS: dict[str, dict[str, Any]] = {
    "adadelta": {"rho": 0.9, "eps": 1e-6},
    "sgd": {"dampening": 0.0},
    "adam": {"betas": (0.9, 0.98), "eps": 1e-8},
}


def resolve_optimizer_name(config: TrainConfig, dataset: str) -> str:
    if config.optimizer != "auto":
        return config.optimizer
    return DEFAULT_OPTIMIZER.get(dataset, "adam")


def optimizer_factory(
    name: str, config: TrainConfig, device: torch.device
) -> Callable[[Sequence[torch.Tensor]], Stepper]:
    """Builds the named optimizer over given tensors, in PyTorch's fastest exact form for ``device``.

    An :class:`InPlaceOptimizer`, which gives torch.optim's single-tensor results bit for bit
    (tests/test_training_loop.py checks), but on CUDA torch.optim's fused kernels where PyTorch has
    them (SGD, Adam), which round differently in the last bits (a GPU run is not bit-reproducible
    anyway). With ``train.compile`` always the former: the compiled step fuses its update rule itself.
    """
    if name not in UPDATE_RULES:
        raise ValueError(f"unknown optimizer {name!r}")
    hyper: dict[str, Any] = {
        "lr": config.lr if config.lr is not None else DEFAULT_LR[name],
        "weight_decay": config.weight_decay if config.weight_decay is not None else DEFAULT_WEIGHT_DECAY[name],
        **({"momentum": config.momentum} if name == "sgd" else {}),
        **FIXED_HYPERPARAMETERS[name],
    }
    if device.type == "cuda" and name in ("sgd", "adam") and not config.compile:
        fused = torch.optim.SGD if name == "sgd" else torch.optim.Adam
        return lambda params: fused(params, fused=True, **hyper)
    return lambda params: InPlaceOptimizer(params, UPDATE_RULES[name], hyper)


class Stepper(Protocol):
    """What :class:`FlatOptimizer` needs of the optimizer it runs on its flat tensors (a torch.optim one fits)."""

    param_groups: list[dict[str, Any]]
    state: Any

    def step(self) -> None: ...


#: ``rule(param, grad, state, group)``: one algorithm's update of ``param`` in place; ``grad`` may be
#: overwritten, ``state`` (empty at the first step) is the parameter's own.
UpdateRule = Callable[[torch.Tensor, torch.Tensor, dict[str, Any], dict[str, Any]], None]


def _as_tensors(param: torch.Tensor, **constants: float) -> dict[str, torch.Tensor]:
    """Constant operands as 0-dim tensors of ``param``'s dtype: the same product or sum as with the
    Python number (which PyTorch rounds to that dtype), without converting the number at every call."""
    return {k: torch.tensor(v, dtype=param.dtype, device=param.device) for k, v in constants.items()}


def _add_scaled(param: torch.Tensor, scale: float | torch.Tensor, update: torch.Tensor) -> None:
    """``param += scale * update``: torch.optim's fused op for a Python number; a product for a 0-dim
    tensor, the form in which compiled steps pass the numbers that change from step to step (a
    scheduled learning rate, Adam's step size), so that a new value is not a new graph."""
    if isinstance(scale, torch.Tensor):
        param.add_(update * scale)
    else:
        param.add_(update, alpha=scale)


def adadelta_update(param: torch.Tensor, grad: torch.Tensor, state: dict[str, Any], group: dict[str, Any]) -> None:
    """``torch.optim.Adadelta``'s single-tensor update, op for op; its two temporaries live in ``state``."""
    if not state:
        state.update({k: torch.zeros_like(param) for k in ("square_avg", "acc_delta", "std", "delta")})
        state.update(_as_tensors(param, rho=group["rho"], eps=group["eps"]))
    rho, eps, weight_decay = state["rho"], state["eps"], group["weight_decay"]
    square_avg, acc_delta, std, delta = state["square_avg"], state["acc_delta"], state["std"], state["delta"]
    if weight_decay != 0:
        grad = grad.add_(param, alpha=weight_decay)
    square_avg.mul_(rho).addcmul_(grad, grad, value=1 - group["rho"])
    torch.add(square_avg, eps, out=std).sqrt_()
    torch.add(acc_delta, eps, out=delta).sqrt_()
    delta.div_(std).mul_(grad)
    acc_delta.mul_(rho).addcmul_(delta, delta, value=1 - group["rho"])
    _add_scaled(param, -group["lr"], delta)


def sgd_update(param: torch.Tensor, grad: torch.Tensor, state: dict[str, Any], group: dict[str, Any]) -> None:
    """``torch.optim.SGD``'s single-tensor update (no Nesterov), op for op."""
    momentum, weight_decay = group["momentum"], group["weight_decay"]
    if weight_decay != 0:
        grad = grad.add_(param, alpha=weight_decay)
    if momentum != 0:
        buf = state.get("momentum_buffer")
        if buf is None:
            buf = state["momentum_buffer"] = grad.clone()
            state.update(_as_tensors(param, momentum=momentum))
        else:
            buf.mul_(state["momentum"]).add_(grad, alpha=1 - group["dampening"])
        grad = buf
    _add_scaled(param, -group["lr"], grad)


def adam_update(param: torch.Tensor, grad: torch.Tensor, state: dict[str, Any], group: dict[str, Any]) -> None:
    """``torch.optim.Adam``'s single-tensor update (no AMSGrad), op for op; its temporary lives in ``state``."""
    if not state:
        state.update({"step": 0.0, **{k: torch.zeros_like(param) for k in ("exp_avg", "exp_avg_sq", "denom")}})
        state.update(_as_tensors(param, beta2=group["betas"][1], eps=group["eps"]))
    (beta1, beta2), weight_decay = group["betas"], group["weight_decay"]
    exp_avg, exp_avg_sq = state["exp_avg"], state["exp_avg_sq"]
    state["step"] += 1  # in place for a compiled step's tensor, so a CUDA graph's replays count on
    step = state["step"]
    if weight_decay != 0:
        grad = grad.add_(param, alpha=weight_decay)
    exp_avg.lerp_(grad, 1 - beta1)
    exp_avg_sq.mul_(state["beta2"]).addcmul_(grad, grad, value=1 - beta2)
    step_size = group["lr"] / (1 - beta1**step)
    denom = torch.sqrt(exp_avg_sq, out=state["denom"]).div_((1 - beta2**step) ** 0.5).add_(state["eps"])
    if isinstance(step_size, torch.Tensor):
        _add_scaled(param, -step_size, exp_avg / denom)
    else:
        param.addcdiv_(exp_avg, denom, value=-step_size)


UPDATE_RULES: dict[str, UpdateRule] = {"adadelta": adadelta_update, "sgd": sgd_update, "adam": adam_update}


class InPlaceOptimizer:
    """One algorithm's update rule over a few tensors, with torch.optim's interface but not its per-step cost.

    ``torch.optim``'s ``step`` spends, around the arithmetic, a fixed cost per call (hooks, profiler
    records, grad-mode switches, state look-ups, a step counter kept as a tensor) and allocates its
    temporaries anew. Stepping one flat tensor of a small model, that was over a quarter of the optimizer's
    time. The rules run the same kernels in the same order, so the results are equal bit for bit.
    Unlike torch.optim it may overwrite the gradients (:class:`FlatOptimizer` hands it its own copies).
    """

    def __init__(self, params: Sequence[torch.Tensor], rule: UpdateRule, hyper: dict[str, Any]):
        self.rule = rule
        self.param_groups = [{"params": list(params), **hyper}]
        self.state: dict[torch.Tensor, dict[str, Any]] = {}

    @torch.no_grad()
    def step(self) -> None:
        group = self.param_groups[0]
        for p in group["params"]:
            if p.grad is not None:
                self.rule(p, p.grad, self.state.setdefault(p, {}), group)


def build_optimizer(name: str, params: Iterable[torch.nn.Parameter], config: TrainConfig) -> FlatOptimizer:
    """A fresh optimizer over ``params`` as one flat tensor (see :class:`FlatOptimizer`).

    One per training stage, so parameters added by growth are included; frozen parameters
    (``requires_grad`` False) are left out.
    """
    trainable = [p for p in params if p.requires_grad]
    device = trainable[0].device if trainable else torch.device("cpu")
    return FlatOptimizer(trainable, optimizer_factory(name, config, device))


class FlatOptimizer:
    """An optimizer that steps its parameters as one flat tensor.

    AdaDelta, SGD and Adam are elementwise: a parameter's update does not depend on whether it is a
    tensor of its own or a slice of a bigger one, so the results are the per-parameter ones, bit for
    bit. What changes is the cost: about ten kernels per step instead of about ten per parameter
    tensor, which on small models is most of the optimizer's time. While it is in use, the
    parameters are views into the flat buffer; :meth:`release` gives each its own storage back.
    PyTorch skips a parameter that got no gradient in a step; the first step in which only some
    parameters got one (a learner that routes around a layer) therefore splits the flat tensor into
    one group per parameter, exact too, since until then every parameter moved at every step. From
    then on a group without a gradient is skipped.
    """

    def __init__(self, params: Sequence[torch.nn.Parameter], build: Callable[[Sequence[torch.Tensor]], Stepper]):
        self.build = build
        self.groups = [list(params)] if params else []
        self.flats = [_share_one_buffer(group) for group in self.groups]
        self.inner = build(self.flats)

    @property
    def param_groups(self) -> list[dict[str, Any]]:
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

    def continue_from(self, other: FlatOptimizer, take: Callable[[torch.Tensor], torch.Tensor]) -> None:
        """Go on with ``other``'s hyperparameters and state, both optimizers of one group: ``take`` maps
        a per-element state tensor of ``other``'s flat tensor onto this one's (ensemble members that
        stopped training leave the stack, :mod:`alma_daemon.training.members`)."""
        (old_flat,), (new_flat,) = other.flats, self.flats
        self.inner.param_groups[0].update({k: v for k, v in other.inner.param_groups[0].items() if k != "params"})
        state = other.inner.state.get(old_flat)
        if state:
            self.inner.state[new_flat] = _carried_state(state, old_flat, take)

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
                part = slice(offset, offset + p.numel())
                self.inner.state[new] = _carried_state(state, flat, lambda v: v[part].clone())


def _carried_state(
    state: dict[str, Any], flat: torch.Tensor, take: Callable[[torch.Tensor], torch.Tensor]
) -> dict[str, Any]:
    """``flat``'s optimizer state for another flat tensor: ``take`` maps each per-element tensor (moments,
    momentum buffers); the rest (constants, step counts) is copied."""
    return {
        k: take(v) if torch.is_tensor(v) and v.shape == flat.shape else v.clone() if torch.is_tensor(v) else v
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

    def __init__(self, optimizer: FlatOptimizer, steps: int, warmup: int) -> None:
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
