"""The training loop's speed features change no result: flat optimizer, inputs standardized once, compile fallback."""

from __future__ import annotations

import copy
import dataclasses

import pytest
import torch
import torch.nn.functional as F

from alma_daemon.config import TrainConfig
from alma_daemon.data.augment import flip_and_crop
from alma_daemon.data.datasets import MNIST_TASK, TaskInfo
from alma_daemon.models.backbones import build_backbone
from alma_daemon.models.noise import SeededDropout
from alma_daemon.seeding import generator
from alma_daemon.training import compile as compile_module
from alma_daemon.training.loop import EVAL_BATCH, Trainer, pass_batch_sizes
from alma_daemon.training.optim import DEFAULT_LR, FlatOptimizer, optimizer_factory
from tests.helpers.data import separable_data

CIFAR_LIKE = TaskInfo(
    "classification", (32, 32, 3), 4, mean=(0.5, 0.4, 0.3), std=(0.25, 0.2, 0.3), channels_last=True, augment=True
)
CONFIG = TrainConfig(epochs=3, patience=3, batch_size=32)


def plain_fit(net, train, val, config: TrainConfig, optimizer: torch.optim.Optimizer, augment: bool, seed: int):
    """The textbook loop on the batches Trainer.fit draws: per-parameter optimizer, the model's own Normalize.

    Returns the best validation error and the weights of its epoch.
    """
    gen = generator(seed, "fit", "model")
    best_error, best_state = float("inf"), None
    for _ in range(config.epochs):
        net.train()
        for index in torch.randperm(len(train), generator=gen).split(pass_batch_sizes(len(train), config.batch_size)):
            xb = train.x[index]
            if augment:
                xb = flip_and_crop(xb, gen)
            optimizer.zero_grad(set_to_none=True)
            F.cross_entropy(net(xb), train.y[index]).backward()
            optimizer.step()
        net.eval()
        with torch.inference_mode():
            error = int((net(val.x[:EVAL_BATCH]).argmax(1) != val.y[:EVAL_BATCH]).sum()) / len(val)
        if error < best_error:
            best_error, best_state = error, copy.deepcopy(net.state_dict())
    return best_error, best_state


@pytest.mark.parametrize(
    ("n", "sizes"),
    [
        (900, [128] * 6 + [132]),  # a 2-chunk CIFAR-10 stage: the 4-image tail joins the last batch
        (960, [128] * 7 + [64]),  # half a batch stands on its own
        (1024, [128] * 8),
        (100, [100]),  # a pass under one batch is its only batch, however small
        (130, [130]),
    ],
)
def test_a_pass_never_ends_on_a_batch_under_half_the_batch_size(n, sizes) -> None:
    assert pass_batch_sizes(n, 128) == sizes
    trainer = Trainer(dataclasses.replace(CONFIG, batch_size=128), "adam", torch.device("cpu"), seed=0)
    batches = list(trainer.batches(n, torch.Generator().manual_seed(0), None))
    assert [len(b) for b in batches] == sizes
    assert sorted(torch.cat(batches).tolist()) == list(range(n))


@pytest.mark.slow
@pytest.mark.parametrize("task,width,optimizer", [(MNIST_TASK, 16, "adadelta"), (CIFAR_LIKE, 4, "sgd")])
def test_trainer_gives_the_textbook_loops_weights_bit_for_bit(task, width, optimizer) -> None:
    train, val = separable_data(task, 160, seed=1), separable_data(task, 40, seed=2)
    torch.manual_seed(0)
    net = build_backbone(task, width)
    twin = copy.deepcopy(net)
    report = Trainer(CONFIG, optimizer, torch.device("cpu"), seed=5, augment=task.augment).fit(net, train, val)
    lr = DEFAULT_LR[optimizer]
    plain_optimizer = (
        torch.optim.Adadelta(twin.parameters(), lr=lr)
        if optimizer == "adadelta"
        else torch.optim.SGD(twin.parameters(), lr=lr, momentum=0.9, weight_decay=1e-4)
    )
    best_error, best_state = plain_fit(twin, train, val, CONFIG, plain_optimizer, task.augment, seed=5)
    assert report.val_error == best_error
    for key, value in net.state_dict().items():
        assert torch.equal(value, best_state[key]), key


@pytest.mark.parametrize("name", ["adadelta", "sgd", "adam"])
def test_flat_optimizer_steps_exactly_like_the_per_parameter_one_even_when_gradients_go_missing(name) -> None:
    """A step where some parameters get no gradient splits the flat tensor per parameter, and those are
    skipped, as PyTorch skips them."""
    torch.manual_seed(0)
    nets = [torch.nn.Sequential(torch.nn.Linear(5, 7), torch.nn.ReLU(), torch.nn.Linear(7, 3)) for _ in range(2)]
    twins = copy.deepcopy(nets)
    config = TrainConfig(lr=0.1, weight_decay=0.01)
    flat = FlatOptimizer(
        [p for n in nets for p in n.parameters()], optimizer_factory(name, config, torch.device("cpu"))
    )
    params = [p for n in twins for p in n.parameters()]
    reference = {
        "adadelta": lambda: torch.optim.Adadelta(params, lr=0.1, weight_decay=0.01),
        "sgd": lambda: torch.optim.SGD(params, lr=0.1, momentum=0.9, weight_decay=0.01),
        "adam": lambda: torch.optim.Adam(params, lr=0.1, betas=(0.9, 0.98), eps=1e-8, weight_decay=0.01),
    }[name]()
    x = torch.randn(4, 5)
    for step in range(6):
        for optimizer, models in ((flat, nets), (reference, twins)):
            optimizer.zero_grad()
            for i, net in enumerate(models):
                if step == 2 and i == 1:
                    continue  # the second model gets no gradient at all: the split, its parameters skipped
                if step >= 4 and i == 0:
                    net[2](x[:, :3].repeat(1, 3)[:, :7]).sum().backward()  # only the last layer
                    continue
                net(x).pow(2).sum().backward()
            optimizer.step()
        for a, b in zip([p for n in nets for p in n.parameters()], [p for n in twins for p in n.parameters()]):
            assert torch.equal(a, b), f"step {step}"
    assert len(flat.flats) == 8  # the partial step split the flat tensor per parameter (2 x 4)
    flat.release()
    assert all(p.data.untyped_storage().nbytes() == p.numel() * 4 for n in nets for p in n.parameters())


def test_without_a_compiler_train_compile_runs_eager_with_the_eager_results(monkeypatch, caplog) -> None:
    monkeypatch.setenv("CXX", "no-such-compiler-anywhere")
    train, val = separable_data(MNIST_TASK, 96, seed=1), separable_data(MNIST_TASK, 32, seed=2)
    reports = []
    for compile_flag in (False, True):
        torch.manual_seed(0)
        net = build_backbone(MNIST_TASK, 8)
        config = dataclasses.replace(CONFIG, compile=compile_flag)
        reports.append((Trainer(config, "adadelta", torch.device("cpu"), seed=1).fit(net, train, val), net))
    (eager, eager_net), (fallback, fallback_net) = reports
    assert (fallback.val_error, fallback.flops, fallback.steps) == (eager.val_error, eager.flops, eager.steps)
    assert all(torch.equal(a, b) for a, b in zip(eager_net.parameters(), fallback_net.parameters()))
    assert (
        compile_module.compiler_missing(torch.device("cpu")) == "no C++ compiler ('no-such-compiler-anywhere') on PATH"
    )


# Inductor builds CPU kernels with a C++ compiler; without one train.compile runs eager (tested above
# with a missing compiler), so there is nothing compiled to test. scripts/setup.sh installs g++ where
# it is missing, so CI runs these tests.
needs_cpu_compiler = pytest.mark.skipif(
    compile_module.compiler_missing(torch.device("cpu")) is not None,
    reason=f"torch.compile cannot build CPU kernels here: {compile_module.compiler_missing(torch.device('cpu'))}",
)


class CompiledSteps:
    """Counts the calls of the whole-step compiled function (it still runs them)."""

    def __init__(self, monkeypatch) -> None:
        self.calls = 0
        real = compile_module.compiled_train_step("cpu")

        def counted(*args, **kwargs):
            self.calls += 1
            return real(*args, **kwargs)

        monkeypatch.setattr(compile_module, "compiled_train_step", lambda device_type: counted)


def fit_twice(make_net, train, val, config: TrainConfig, optimizer: str, runs=(False, True, True)):
    """Fit a fresh seeded net once per ``train.compile`` flag in ``runs``; the reports and the nets."""
    out = []
    for compile_flag in runs:
        torch.manual_seed(0)
        net = make_net()
        report = Trainer(dataclasses.replace(config, compile=compile_flag), optimizer, torch.device("cpu"), seed=1).fit(
            net, train, val
        )
        out.append((report, net))
    return out


@pytest.mark.slow
@needs_cpu_compiler
def test_train_compile_runs_whole_steps_compiled_reproducibly_and_counts_the_eager_flops(monkeypatch) -> None:
    """Fused kernels round differently, so the results are close to eager ones, not equal; but equal
    from run to run, and the FLOPs are the eager step's."""
    compiled_steps = CompiledSteps(monkeypatch)
    train, val = separable_data(MNIST_TASK, 256, seed=1), separable_data(MNIST_TASK, 64, seed=2)
    config = dataclasses.replace(CONFIG, epochs=4, patience=4)
    (eager, _), (compiled, net), (again, twin) = fit_twice(
        lambda: build_backbone(MNIST_TASK, 8), train, val, config, "adadelta"
    )
    # 8 full batches of 32 per epoch; the first of the stage runs eager under the FLOP counter.
    assert compiled_steps.calls == 2 * (4 * 8 - 1)
    assert compiled.flops == eager.flops and compiled.steps == eager.steps
    assert compiled.val_error <= 0.2 and abs(compiled.val_error - eager.val_error) <= 0.1
    assert all(torch.equal(a, b) for a, b in zip(net.state_dict().values(), twin.state_dict().values()))


@pytest.mark.slow
@needs_cpu_compiler
def test_train_compile_traces_a_switch_lm_step_once_under_its_learning_rate_schedule(monkeypatch) -> None:
    """An LM stage changes the learning rate at every step (warm-up, then decay) and Adam counts its
    steps: as Python numbers each new value compiled the step again, up to Dynamo's limit. Its
    dropout of 0 draws no noise, so the step compiles; the results are close to eager ones."""
    from torch._dynamo.utils import counters

    from tests.helpers.contract import token_data
    from tests.helpers.switch_lm import tiny_learner, trainer

    torch._dynamo.reset()
    counters.clear()
    compiled_steps = CompiledSteps(monkeypatch)
    train, val = token_data(64, seed=1), token_data(16, seed=2)
    reports = []
    for compile_flag in (False, True):
        stage = trainer(steps=12)
        stage.config = dataclasses.replace(stage.config, compile=compile_flag)
        reports.append(tiny_learner("switch-lm").fit(train, val, stage))
    eager, compiled = reports
    assert compiled_steps.calls == 12 - 1  # the first step runs eager, under the FLOP counter
    assert counters["frames"]["total"] == 1
    assert compiled.flops == eager.flops
    assert compiled.val_error == pytest.approx(eager.val_error, rel=1e-3)


@pytest.mark.slow
@needs_cpu_compiler
def test_train_compile_traces_every_stage_of_a_growing_model_past_dynamos_default_limit() -> None:
    """Each stage of a growing model is a new architecture, traced anew: under Dynamo's default of
    8 traces per function the ninth stage and every later one ran eager."""
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    counters.clear()
    train, val = separable_data(MNIST_TASK, 96, seed=1), separable_data(MNIST_TASK, 32, seed=2)
    config = dataclasses.replace(CONFIG, epochs=1, patience=1, compile=True)
    for width in range(2, 11):  # nine architectures
        torch.manual_seed(0)
        Trainer(config, "adadelta", torch.device("cpu"), seed=1).fit(build_backbone(MNIST_TASK, width), train, val)
    assert counters["frames"]["ok"] == 9


class TinyConvNet(torch.nn.Sequential):
    def __init__(self) -> None:
        super().__init__(
            torch.nn.Conv2d(3, 4, 3),
            torch.nn.BatchNorm2d(4),
            torch.nn.ReLU(),
            torch.nn.AdaptiveAvgPool2d(1),
            torch.nn.Flatten(),
            torch.nn.Linear(4, CIFAR_LIKE.num_classes),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return super().forward(x.permute(0, 3, 1, 2).float() / 255)


@pytest.mark.slow
@needs_cpu_compiler
def test_train_compile_updates_batch_norm_statistics_as_eager_steps_do(monkeypatch) -> None:
    compiled_steps = CompiledSteps(monkeypatch)
    train, val = separable_data(CIFAR_LIKE, 96, seed=1), separable_data(CIFAR_LIKE, 32, seed=2)
    config = dataclasses.replace(CONFIG, epochs=1, patience=1)  # one epoch: the weights kept are the last
    (_, eager_net), (_, compiled_net) = fit_twice(TinyConvNet, train, val, config, "sgd", runs=(False, True))
    assert compiled_steps.calls == 3 - 1
    eager_bn, compiled_bn = eager_net[1], compiled_net[1]
    assert compiled_bn.num_batches_tracked == eager_bn.num_batches_tracked == 3
    assert torch.allclose(compiled_bn.running_mean, eager_bn.running_mean, rtol=1e-3, atol=1e-3)
    assert torch.allclose(compiled_bn.running_var, eager_bn.running_var, rtol=1e-3, atol=1e-3)
    assert not torch.equal(compiled_bn.running_mean, torch.zeros(4))


class WithUnusedLayer(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.used, self.unused = torch.nn.Linear(784, 10), torch.nn.Linear(3, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.used(x.flatten(1).float() / 255)


@pytest.mark.slow
@pytest.mark.parametrize(
    "net,reason", [(WithUnusedLayer, None), (lambda: SeededDropoutNet(), "SeededDropout draw noise")]
)
def test_train_compile_steps_eager_with_the_eager_results_where_compiled_gradients_would_differ(
    monkeypatch, caplog, net, reason
) -> None:
    """A parameter without a gradient (``torch.func.grad`` would give it zeros) or noise drawn from a
    generator of the model's own (not traced): the steps run eager, with the eager results."""
    monkeypatch.setattr(compile_module, "_said", set())  # each reason is said once per process
    compiled_steps = CompiledSteps(monkeypatch)
    train, val = separable_data(MNIST_TASK, 96, seed=1), separable_data(MNIST_TASK, 32, seed=2)
    (eager, eager_net), (fallback, fallback_net) = fit_twice(net, train, val, CONFIG, "sgd", runs=(False, True))
    assert compiled_steps.calls == 0
    assert (fallback.val_error, fallback.flops) == (eager.val_error, eager.flops)
    assert all(torch.equal(a, b) for a, b in zip(eager_net.parameters(), fallback_net.parameters()))
    if reason:
        assert any(reason in str(getattr(r, "reason", "")) for r in caplog.records)


class SeededDropoutNet(torch.nn.Sequential):
    def __init__(self) -> None:
        super().__init__(torch.nn.Flatten(), torch.nn.Linear(784, 10), SeededDropout(0.1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return super().forward(x.float() / 255)


def test_bf16_precision_trains_under_autocast_and_keeps_fp32_weights() -> None:
    train, val = separable_data(MNIST_TASK, 256, seed=1), separable_data(MNIST_TASK, 64, seed=2)
    torch.manual_seed(0)
    net = build_backbone(MNIST_TASK, 16)
    config = dataclasses.replace(CONFIG, epochs=4, patience=4, precision="bf16")
    report = Trainer(config, "adadelta", torch.device("cpu"), seed=1).fit(net, train, val)
    assert report.val_error <= 0.2
    assert all(p.dtype == torch.float32 for p in net.parameters())


def test_a_stage_with_nothing_to_validate_on_trains_every_epoch_and_keeps_the_last_weights() -> None:
    """A stage of one-example chunks has an empty validation share: no epoch can be judged the best."""
    from alma_daemon.training.losses import task_loss
    from alma_daemon.training.members import fit_stacked

    config = TrainConfig(epochs=4, patience=0, batch_size=8)
    train = separable_data(MNIST_TASK, 32, seed=1)
    nothing = train.subset(slice(0, 0))
    trainer = Trainer(config, "adadelta", torch.device("cpu"), seed=0)
    torch.manual_seed(0)
    net = build_backbone(MNIST_TASK, 8)
    report = trainer.fit(net, train, nothing)
    assert report.epochs == report.best_epoch == 4 and report.steps == 16
    assert report.val_error != report.val_error  # NaN: nothing was measured
    torch.manual_seed(0)
    members = [build_backbone(MNIST_TASK, 8) for _ in range(2)]
    stacked = fit_stacked(trainer, list(enumerate(members)), train, nothing, task_loss(MNIST_TASK))
    assert all(r.epochs == r.best_epoch == 4 for r in stacked.values())
