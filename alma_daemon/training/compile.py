"""``train.compile``: a whole training step (forward, backward and the optimizer's update) as one
compiled function, where a compiler is present.

Compiling only the forward pass paid little: on small models most of a step is the per-op cost of
the eager backward pass and the optimizer's elementwise passes, which a compiled forward leaves as
they are. :class:`CompiledStep` takes the gradient with ``torch.func.grad`` over the optimizer's flat
parameter tensor and applies the same update rule (:data:`~alma_daemon.training.optim.UPDATE_RULES`)
inside the one traced function, so Inductor fuses the backward's and the update's elementwise work
into a few kernels. On CUDA the compiled step runs as a CUDA graph (``reduce-overhead``), since a
small model's step there is mostly kernel launches. A stage of the README's MNIST job trains 2.1
times as fast as a hand-written eager loop on this project's 2-core CPU and 4.5 times on an H100, a
CIFAR VGG 1.95 times on the H100 (on the CPU it gains nothing, its convolutions being most of the
step); docs/scaling.md.

What it keeps and what it changes:

- The optimizer state is the eager optimizer's own, so compiled and eager steps can alternate: the
  first step of each batch shape runs eager under the FLOP counter, and so does every batch smaller
  than ``train.batch_size`` (a stage's last one), which would otherwise compile again for each new
  remainder size.
- Fused kernels round differently from eager ones: the results are close to the eager loop's, not
  equal, and the same from run to run on one machine and thread count.
- Numbers that change from step to step (a scheduled learning rate, Adam's step count) go in as
  0-dim tensors; as Python numbers each new value would trace the step again.
- It is used only where its gradients are the eager step's: one process (DDP's hooks need autograd's
  backward pass), a model that draws no noise from a generator of its own (``torch.compile`` does not
  trace explicit generators: dropout above 0, hard gates), and a step in which every parameter got a
  gradient (``torch.func.grad`` gives an unused parameter zeros, where the eager optimizer skips it).
  Elsewhere the loop runs eager and says why once.

Dynamo keeps the compiled code per process, guarded on the model's structure, so the next stage of a
stream reuses it; growth or a new optimizer compiles again. Compiling takes seconds (MNIST MLP) to
minutes (VGG on a CPU), which is why the key is off by default.
"""

from __future__ import annotations

import functools
import logging
import os
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from torch.func import functional_call

from alma_daemon.models.noise import DrawsNoise
from alma_daemon.training.optim import FlatOptimizer, InPlaceOptimizer, UpdateRule

log = logging.getLogger(__name__)

_said: set[str] = set()

#: ``objective(net, x, y) -> scalar loss``; the training loop's default is cross-entropy on ``net(x)``.
Objective = Callable[[nn.Module, torch.Tensor, torch.Tensor], torch.Tensor]


def compiler_missing(device: torch.device) -> str | None:
    """Why ``torch.compile`` cannot build kernels for ``device`` here, or None when it can."""
    if device.type == "cuda":
        from torch.utils._triton import has_triton

        return None if has_triton() else "Triton is not installed"
    if device.type == "cpu":
        compiler = os.environ.get("CXX", "g++")  # what Inductor runs
        return None if shutil.which(compiler) else f"no C++ compiler ({compiler!r}) on PATH"
    return f"no compiler support for {device.type}"


def whole_step_unavailable(net: nn.Module, device: torch.device, spans_ranks: bool) -> str | None:
    """Why a training step of ``net`` cannot be compiled whole, or None when it can."""
    if spans_ranks:
        return "data-parallel ranks average gradients in autograd's backward pass"
    noisy = sorted(
        {type(module).__name__ for module in net.modules() if isinstance(module, DrawsNoise) and module.draws_noise}
    )
    if noisy:
        return f"the model's {', '.join(noisy)} draw noise from a generator of their own, which torch.compile does not trace"
    return compiler_missing(device)


def say_eager_once(reason: str) -> None:
    if reason not in _said:
        _said.add(reason)
        log.warning("train.compile: running eager", extra={"reason": reason})


class _Loss(nn.Module):
    """The stage's objective as a module holding the net, so ``functional_call`` can put the flat
    tensor's views in place of the net's parameters for one call."""

    def __init__(self, net: nn.Module, objective: Objective, autocast_dtype: torch.dtype | None):
        super().__init__()
        self.net = net
        self.objective = objective
        self.autocast_dtype = autocast_dtype

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        dtype = self.autocast_dtype
        with torch.autocast(x.device.type, dtype=dtype or torch.bfloat16, enabled=dtype is not None):
            return self.objective(self.net, x, y)


@dataclass(frozen=True)
class FlatLoss:
    """The stage's loss as the traced step reads it: the module, the names of the parameters that the
    flat tensor holds (in its order), and the module's buffers (batch-norm statistics)."""

    module: _Loss
    names: tuple[str, ...]
    buffers: dict[str, torch.Tensor]


@dataclass(frozen=True)
class FlatUpdate:
    """One update of the optimizer's flat parameter tensor: the tensor, the update rule, its state
    (updated in place) and the parameter group's hyperparameters."""

    flat: torch.Tensor
    rule: UpdateRule
    state: dict[str, Any]
    group: dict[str, Any]


def _train_step(loss: FlatLoss, update: FlatUpdate, x: torch.Tensor, y: torch.Tensor) -> None:
    """One step, traced whole: the gradient of ``loss`` with respect to ``update.flat`` and the update
    rule on it.

    Buffers (batch-norm statistics) are arguments, not captured tensors: ``torch.func.grad`` refuses
    in-place updates of captured tensors.
    """
    module, names = loss.module, loss.names
    shapes = [module.get_parameter(name).shape for name in names]

    def loss_of(flat: torch.Tensor, buffers: dict[str, torch.Tensor]) -> torch.Tensor:
        parts = flat.split([shape.numel() for shape in shapes])
        views = {name: part.view(shape) for name, part, shape in zip(names, parts, shapes)}
        return functional_call(module, {**views, **buffers}, (x, y))

    grad = torch.func.grad(loss_of)(update.flat, loss.buffers)
    update.rule(update.flat, grad, update.state, update.group)


#: Traces of the step kept per process. Every stage of a growing model (Firefly, gEns, gMoE) is a new
#: architecture and traces the step anew; under Dynamo's default of 8 the ninth ran eager, for good.
TRACES_KEPT = 64


@functools.cache
def compiled_train_step(device_type: str) -> Callable[..., None]:
    """``_train_step`` compiled for ``device_type``, built on first use: ``torch.compile`` imports the
    compiler, two seconds that a command which never trains compiled (``alma --help``) should not pay.

    On CUDA the step runs as a CUDA graph: a small model's step is mostly kernel launches, which a
    graph replays in one. Inputs it updates in place are marked static (see :class:`CompiledStep`).
    """
    if device_type == "cuda":
        return torch.compile(_train_step, mode="reduce-overhead")
    return torch.compile(_train_step)


class CompiledStep:
    """Training steps of ``net`` on ``optimizer``'s flat tensor, compiled whole (see the module's docstring).

    ``optimizer`` must hold the net's trainable parameters as one flat tensor stepped by an
    :class:`~alma_daemon.training.optim.InPlaceOptimizer`; :meth:`takes` says whether a step can run here.
    """

    def __init__(
        self,
        net: nn.Module,
        objective: Objective,
        optimizer: FlatOptimizer,
        batch_size: int,
        autocast_dtype: torch.dtype | None,
    ):
        self.loss = _Loss(net, objective, autocast_dtype)
        self.optimizer = optimizer
        self.batch_size = batch_size
        names = {id(p): f"net.{name}" for name, p in net.named_parameters()}
        self.names = tuple(names[id(p)] for group in optimizer.groups for p in group)
        self.buffers = dict(self.loss.named_buffers())
        self.flat_loss = FlatLoss(self.loss, self.names, self.buffers)
        self.lr: torch.Tensor | None = None  # the learning rate as the compiled step takes it; set at the first step

    def takes(self, x: torch.Tensor) -> bool:
        """Whether the step on batch ``x`` runs compiled: a full batch, and the optimizer still one flat
        tensor stepped by our update rules (it splits per parameter once a step leaves one without a
        gradient), whose state an eager step has set up."""
        inner, flats = self.optimizer.inner, self.optimizer.flats
        return (
            len(x) == self.batch_size
            and len(flats) == 1
            and isinstance(inner, InPlaceOptimizer)
            and bool(inner.state.get(flats[0]))
        )

    def __call__(self, x: torch.Tensor, y: torch.Tensor) -> None:
        inner = self.optimizer.inner
        assert isinstance(inner, InPlaceOptimizer)
        (flat,) = self.optimizer.flats
        state = inner.state[flat]
        first = self.lr is None
        if self.lr is None:
            self.lr = self._prepare(flat, state)
        group = {k: v for k, v in inner.param_groups[0].items() if k != "params"}
        # Numbers that change from step to step go in as tensors, or each new value would compile again.
        group["lr"] = self.lr.fill_(group["lr"])
        step = compiled_train_step(flat.device.type)
        args = (self.flat_loss, FlatUpdate(flat, inner.rule, state, group), x, y)
        if not first:
            with torch.no_grad():
                step(*args)
            return
        # A stage's first step is where a new architecture traces it (the patch costs 0.2 ms: not per step).
        with torch.no_grad(), torch._dynamo.config.patch(recompile_limit=TRACES_KEPT):
            step(*args)

    def _prepare(self, flat: torch.Tensor, state: dict[str, Any]) -> torch.Tensor:
        """Before the stage's first compiled step: Python numbers in the optimizer state (Adam's step
        count) become tensors, which the rules then update in place; on CUDA, the tensors the step
        updates in place are marked static. Returns the tensor that will hold the learning rate."""
        for key, value in state.items():
            if isinstance(value, float):
                state[key] = torch.tensor(value, device=flat.device)
        lr = flat.new_zeros(())
        if flat.is_cuda:
            # A CUDA graph reads and writes fixed addresses: the tensors the step updates in place
            # keep theirs for the stage (a new stage's new ones record the graph again, once).
            for tensor in (flat, lr, *self.buffers.values(), *state.values()):
                if isinstance(tensor, torch.Tensor):
                    torch._dynamo.mark_static_address(tensor)
        return lr
