"""The one training loop shared by every learner.

:meth:`Trainer.fit` trains one ``nn.Module`` (a backbone, a mixture, a new ensemble member) on a
stage's data with mini-batches, evaluates on the stage's validation set after every epoch, stops
early after ``patience`` epochs without improvement and keeps the best epoch (a team's task: the last
one, unless an earlier one validated better by more than a standard error). With a step budget
(``steps``, language models) the stage is instead exactly that many steps under a warm-up then
linear-decay learning rate, validated once at the end. Learners differ in *what* they hand to the
loop, never in the loop itself (:mod:`alma_daemon.training.members` runs the same epochs for
several ensemble members at once).

Where its time goes, and what the loop does about it (``benchmarks/bench_training.py`` measures it
against a hand-written loop): the stage's inputs are standardized once, not per batch
(:func:`~alma_daemon.models.backbones.inputs_standardized_outside`), and an augmented batch is one
gather of standardized pixels (:class:`~alma_daemon.data.augment.PixelRows`); the optimizer updates
every parameter as one flat tensor with torch.optim's arithmetic but not its per-step bookkeeping
(:class:`~alma_daemon.training.optim.FlatOptimizer`); batch indices move to the device once per
epoch and evaluation reads one count back per pass, so a GPU is not stalled by host
synchronizations. None of this changes a CPU result: the series are bit for bit those of the plain
loop. ``train.precision`` and ``train.compile`` (the whole step compiled,
:mod:`alma_daemon.training.compile`) are opt-in and do change results slightly. What the eager loop
cannot touch is the model's own arithmetic: on the CPU a VGG step is mostly convolutions and batch
norms, the same kernels in both loops (docs/scaling.md gives the profile).
"""

from __future__ import annotations

import contextlib
import functools
import math
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from alma_daemon.config import TrainConfig
from alma_daemon.data.augment import PixelRows
from alma_daemon.data.tensors import LabeledData
from alma_daemon.models.backbones import Normalize, inputs_standardized_outside
from alma_daemon.models.noise import draw_noise_from
from alma_daemon.seeding import generator as seeded_generator
from alma_daemon.training.compile import CompiledStep, Objective, say_eager_once, whole_step_unavailable
from alma_daemon.training.data_parallel import DataParallel
from alma_daemon.training.flops import FlopMeter
from alma_daemon.training.optim import FlatOptimizer, LinearWarmupDecay, build_optimizer
from alma_daemon.training.validated import binomial

#: Mini-batch size for evaluation passes (no gradients, so larger than training batches).
EVAL_BATCH = 2048


#: ``validate(net, val, meter) -> float``, lower is better; called in eval mode without gradients. A
#: measure that is a mean over examples returns a :class:`~alma_daemon.training.validated.Validated`, which
#: carries its standard error.
Validate = Callable[[nn.Module, LabeledData, FlopMeter], float]

#: Which epoch a stage keeps (``train.keep_epoch``): the best on the validation set, or the last unless an
#: earlier one validated better by more than the last one's standard error.
KEEP_EPOCH_RULES = ("best", "last_unless_beaten")


def pass_batch_sizes(n: int, batch: int) -> list[int]:
    """Sizes of the batches of one pass over ``n`` examples: full batches of ``batch``, and what is left.

    A remainder under half a batch joins the last full batch instead of making a batch of its own: a
    CIFAR-10 stage of 900 images in batches of 128 would otherwise end every epoch on 4 images, and a
    batch-norm net takes a noisy step on them and carries their statistics into its running means
    (docs/policies.md measured the CER it costs). So no batch but a pass's only one is under half of
    ``batch``, and none is over one and a half.
    """
    full, rest = divmod(n, batch)
    if full and 0 < rest < batch / 2:
        return [batch] * (full - 1) + [batch + rest]
    return [batch] * full + ([rest] if rest else [])


def cross_entropy_objective(net: nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(net(x), y)


@dataclass
class FitReport:
    """What one training stage cost and achieved."""

    flops: int = 0
    seconds: float = 0.0
    steps: int = 0
    epochs: int = 0
    best_epoch: int = 0
    val_error: float | None = None

    def merge(self, other: FitReport) -> FitReport:
        """Combine reports of parts trained one after another (ensemble members): the work (FLOPs,
        seconds, steps, epochs) is summed over the parts, ``best_epoch`` is the latest part's best,
        and ``val_error`` stays the first part's."""
        return FitReport(
            flops=self.flops + other.flops,
            seconds=self.seconds + other.seconds,
            steps=self.steps + other.steps,
            epochs=self.epochs + other.epochs,
            best_epoch=max(self.best_epoch, other.best_epoch),
            val_error=other.val_error if self.val_error is None else self.val_error,
        )


class EarlyStopping:
    """The best validation measure so far, the weights that reached it, and whether to stop: once more
    than ``patience`` epochs in a row did not improve on the best.

    ``keep`` (:data:`KEEP_EPOCH_RULES`) is the epoch :meth:`restore` leaves in the network. ``best``
    restores the best one, as the paper's stages do. ``last_unless_beaten`` keeps the last one where the
    stage ran out of epochs still learning, unless the best validated better by more than the last one's
    standard error: on a stream of small stages with a few hundred validation examples, the best of a few
    epochs is mostly the luckiest draw, and restoring it throws away training the network needed
    (benchmarks/results/long_stream_keep_tune.md). A stage that ``patience`` stopped has shown that the
    epochs after its best taught nothing the validation set could see: it restores the best (kept after
    25 more epochs, River's Hyperplane served 0.096 instead of 0.077).
    """

    def __init__(self, patience: int, keep: str = "best"):
        if keep not in KEEP_EPOCH_RULES:
            raise ValueError(f"keep epoch {keep!r}: expected one of {', '.join(KEEP_EPOCH_RULES)}")
        self.patience = patience
        self.keep = keep
        self.best_error, self.best_epoch, self.bad_epochs = float("inf"), 0, 0
        self.best_state: dict[str, torch.Tensor] | None = None
        self.last: tuple[float, int] | None = None
        #: Whether ``patience`` ended the stage (rather than its last epoch).
        self.stopped = False

    def update(self, error: float, epoch: int, net: nn.Module) -> bool:
        """Record epoch ``epoch``'s measure; True when training should stop."""
        self.last = (error, epoch)
        if math.isnan(error):
            # Nothing to validate on (a stage of one-example chunks): train every epoch, keep the last.
            self.best_error, self.best_epoch, self.best_state = error, epoch, None
            return False
        if error < self.best_error:
            self.best_error, self.best_epoch, self.bad_epochs = error, epoch, 0
            self.best_state = {k: v.detach().clone() for k, v in net.state_dict().items()}
            return False
        self.bad_epochs += 1
        self.stopped = self.bad_epochs > self.patience
        return self.stopped

    def restore(self, net: nn.Module) -> None:
        """Leave the epoch ``keep`` chooses in ``net`` (it holds the last epoch's weights); ``best_epoch``
        and ``best_error`` then name the epoch kept."""
        if self.best_state is None:
            return
        if self.keep == "last_unless_beaten" and self.last is not None and not self.stopped:
            error, epoch = self.last
            if error <= self.best_error + getattr(error, "standard_error", 0.0):
                self.best_error, self.best_epoch = error, epoch
                return
        net.load_state_dict(self.best_state)


class StageInputs:
    """A stage's examples on the training device, standardized once where the model allows it.

    Every example is standardized once per stage and a batch is a gather of rows. With augmentation
    (flips and padded crops, padding black) the padding pixel is standardized alike and a batch is
    one gather of pixels (:class:`~alma_daemon.data.augment.PixelRows`): the same floats as cropping
    raw images and standardizing them, since standardizing is elementwise.
    """

    def __init__(self, data: LabeledData, normalize: Normalize | None, device: torch.device, augment: bool):
        self.normalize = normalize
        x = data.x.to(device)
        self.crops: PixelRows | None = None
        if augment:
            self.crops = PixelRows(x, None if normalize is None else normalize.standardize_)
            self.x = self.crops.images()
        else:
            self.x = x if normalize is None else normalize.standardize(x)
        self.y = data.y.to(device)

    def __len__(self) -> int:
        return len(self.y)

    def batch(self, index: torch.Tensor, gen: torch.Generator | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """Examples ``index`` as the model takes them; ``gen`` draws the augmentation, if any."""
        if self.crops is None:
            x = self.x.index_select(0, index)
        else:
            assert gen is not None  # an augmenting stage's caller passes the generator of its draws
            x = self.crops.flip_and_crop(index, gen)
        return (x if self.normalize is None else self.normalize.arrange(x)), self.y.index_select(0, index)

    def whole(self) -> LabeledData:
        """Every example, as the model takes it (for evaluation passes)."""
        return LabeledData(self.x if self.normalize is None else self.normalize.arrange(self.x), self.y)


class Trainer:
    """Runs the training loop for one stage; seeded by (run seed, stage index) for exact resumes."""

    def __init__(
        self,
        config: TrainConfig,
        optimizer: str,
        device: torch.device,
        seed: int,
        augment: bool = False,
        keep_epoch: str = "best",
    ):
        self.config = config
        self.optimizer = optimizer
        self.device = device
        self.seed = seed
        self.augment = augment
        #: The epoch a stage keeps (:class:`EarlyStopping`'s ``keep``; ``train.keep_epoch`` resolved).
        self.keep_epoch = keep_epoch

    def generator(self, *purpose: object) -> torch.Generator:
        """A CPU generator for shuffling/augmentation that depends only on the stage seed and ``purpose``."""
        return seeded_generator(self.seed, *purpose)

    def autocast(self) -> AbstractContextManager[Any]:
        """``train.precision``: bfloat16 autocast around forward passes, or nothing."""
        if self.config.precision == "bf16":
            return torch.autocast(self.device.type, dtype=torch.bfloat16)
        return contextlib.nullcontext()

    def fit(
        self,
        net: nn.Module,
        train: LabeledData,
        val: LabeledData,
        *,
        purpose: object = "model",
        objective: Objective = cross_entropy_objective,
        steps: int | None = None,
        validate: Validate | None = None,
        data_parallel: bool = False,
    ) -> FitReport:
        """Train ``net`` and keep its best state on the validation measure.

        By default: epochs with early stopping on the validation error. With ``steps``: one round of
        exactly ``steps`` batches (drawn from consecutive reshuffled passes) under a linear warm-up over
        ``warmup_steps`` then a linear decay to zero, validated at its end (paper appendix B.2: the same
        compute for every chunk). ``validate`` replaces the classification error (e.g. a validation loss).
        With ``data_parallel``, the ranks torchrun started (if any) split every batch and the validation
        set between them (:mod:`alma_daemon.training.data_parallel`); every rank must then call ``fit``.
        """
        start = time.perf_counter()
        parallel = DataParallel.across_ranks() if data_parallel else DataParallel()
        gen = self.generator("fit", purpose)
        # Every rank shuffles with ``gen`` alike; what a rank draws for its own slice comes from its own.
        augment_gen = self.generator("fit", purpose, *parallel.own()) if parallel.spans_ranks else gen
        # The label predates hard gates' samples; kept, so dropout masks stay those of earlier runs.
        draw_noise_from(net, seeded_generator(self.seed, "dropout", purpose, *parallel.own(), device=self.device))
        optimizer = build_optimizer(self.optimizer, net.parameters(), self.config)
        schedule = LinearWarmupDecay(optimizer, steps, self.config.warmup_steps) if steps is not None else None
        validate = validate or self.validation_error
        model = parallel.wrap(net, self.device, self.config.batch_size)
        compiled = self.compiled_step(net, objective, optimizer, parallel.spans_ranks)
        meter = FlopMeter()
        stopping = EarlyStopping(self.config.patience, self.keep_epoch)
        steps_done = epoch = 0
        try:
            with inputs_standardized_outside(net) as normalize:
                inputs = StageInputs(train, normalize, self.device, self.augment)
                val_inputs = StageInputs(val, normalize, self.device, augment=False).whole()
                for epoch in range(1, (1 if steps is not None else self.config.epochs) + 1):
                    net.train()
                    for batch in self.batches(len(inputs), gen, steps):
                        index = parallel.take(batch)
                        if index is None:
                            continue
                        xb, yb = inputs.batch(index, augment_gen)
                        share = parallel.loss_share(len(index), len(batch))
                        eager = functools.partial(self.step, model, optimizer, objective, xb, yb, share)
                        meter.run(
                            ("train", tuple(xb.shape)),
                            lambda: compiled(xb, yb) if compiled is not None and compiled.takes(xb) else eager(),
                            counted=eager,
                        )
                        if schedule is not None:
                            schedule.step()
                        steps_done += 1
                    parallel.sync_buffers(net)
                    net.eval()
                    with torch.inference_mode(), self.autocast():
                        error = parallel.validate(validate, net, val_inputs, meter)
                    if stopping.update(error, epoch, net):
                        break
        finally:
            optimizer.release()
        stopping.restore(net)
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        flops, seconds = parallel.summed(meter.total, time.perf_counter() - start)
        return FitReport(
            flops=int(flops),
            seconds=seconds,
            steps=steps_done,
            epochs=epoch,
            best_epoch=stopping.best_epoch,
            val_error=stopping.best_error,
        )

    def compiled_step(
        self, net: nn.Module, objective: Objective, optimizer: FlatOptimizer, spans_ranks: bool
    ) -> CompiledStep | None:
        """``train.compile``'s whole-step compiled function for this stage, or None (eager)."""
        if not self.config.compile:
            return None
        reason = whole_step_unavailable(net, self.device, spans_ranks)
        if reason is not None:
            say_eager_once(reason)
            return None
        dtype = torch.bfloat16 if self.config.precision == "bf16" else None
        return CompiledStep(net, objective, optimizer, self.config.batch_size, dtype)

    def batches(self, n: int, gen: torch.Generator, steps: int | None) -> Iterator[torch.Tensor]:
        """Index batches on the device: one shuffled pass, or ``steps`` full batches from consecutive shuffled passes.

        Each pass's order is drawn when the pass begins (on the CPU generator, so the order does not
        depend on the device) and moved to the device in one copy. A pass's batch sizes are
        :func:`pass_batch_sizes`'s.
        """
        batch = self.config.batch_size
        if steps is None:
            yield from torch.randperm(n, generator=gen).to(self.device).split(pass_batch_sizes(n, batch))
            return
        queue = torch.empty(0, dtype=torch.long, device=self.device)
        for _ in range(steps):
            while len(queue) < batch:
                queue = torch.cat([queue, torch.randperm(n, generator=gen).to(self.device)])
            yield queue[:batch]
            queue = queue[batch:]

    def step(
        self,
        net: nn.Module,
        optimizer: FlatOptimizer,
        objective: Objective,
        x: torch.Tensor,
        y: torch.Tensor,
        share: float = 1.0,
    ) -> None:
        """One optimizer step on ``share`` times the batch's loss (1 but for a rank's uneven slice)."""
        optimizer.zero_grad()
        with self.autocast():
            loss = objective(net, x, y)
        (loss if share == 1.0 else loss * share).backward()
        optimizer.step()

    @staticmethod
    def validation_error(net: nn.Module, val: LabeledData, meter: FlopMeter | None = None) -> float:
        """Classification error of ``net`` on ``val`` with its binomial standard error (validation passes
        count as training compute).

        Wrong predictions are counted on the device and read back once, not once per batch.
        """
        net.eval()
        wrong = torch.zeros((), dtype=torch.long, device=val.y.device)
        with torch.inference_mode():
            for i in range(0, len(val), EVAL_BATCH):
                xb, yb = val.x[i : i + EVAL_BATCH], val.y[i : i + EVAL_BATCH]
                logits = meter.run(("val", tuple(xb.shape)), lambda: net(xb)) if meter else net(xb)
                wrong += (logits.argmax(1) != yb).sum()
        return binomial(int(wrong), len(val))
