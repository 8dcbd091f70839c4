"""FLOP counting: one MLP training step against the analytic count."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch.utils.flop_counter import FlopCounterMode

from alma_daemon.data.datasets import CIFAR10_TASK, MNIST_TASK
from alma_daemon.models.backbones import build_backbone
from alma_daemon.models.switch import SwitchLM, SwitchLMConfig
from alma_daemon.training.flops import FlopMeter, count_flops


def test_one_mlp_step_matches_the_analytic_count():
    width, batch = 64, 128
    net = build_backbone(MNIST_TASK, width)
    x = torch.randint(0, 255, (batch, 28, 28), dtype=torch.uint8)
    y = torch.randint(0, 10, (batch,))

    def step():
        torch.nn.functional.cross_entropy(net(x), y).backward()

    _, flops = count_flops(step)
    # A linear layer (n_in -> n_out) on B examples: forward 2*B*n_in*n_out; backward computes the
    # gradient w.r.t. the weights (same count) and w.r.t. the input (same count), except for the
    # first layer, whose input (the image) needs no gradient.
    layers = [(784, width), (width, width), (width, 10)]
    forward = sum(2 * batch * i * o for i, o in layers)
    backward = 2 * forward - 2 * batch * 784 * width
    assert flops == forward + backward


def test_meter_counts_each_shape_once_and_adds_the_figure_for_repeats():
    a, b = torch.randn(8, 16), torch.randn(16, 4)
    meter = FlopMeter()
    counted = []  # runs of the counted function: only the first of a key runs under the counter
    for _ in range(3):
        meter.run("mm", lambda: a @ b, counted=lambda: counted.append(1) or a @ b)
    assert meter.total == 3 * 2 * 8 * 16 * 4 and counted == [1]


@pytest.mark.slow
def test_the_count_is_flop_counter_modes_total_on_a_conv_net_and_a_switch_lm():
    torch.manual_seed(0)
    vgg = build_backbone(CIFAR10_TASK, 4)
    images, labels = torch.randint(0, 255, (6, 32, 32, 3), dtype=torch.uint8), torch.randint(0, 10, (6,))
    lm = SwitchLM(SwitchLMConfig(vocab_size=50, block_size=16, d_model=32, heads=2, d_ff=64))
    tokens = torch.randint(0, 50, (3, 16))

    def vgg_step():
        F.cross_entropy(vgg(images), labels).backward()

    def lm_step():
        out = lm(tokens)
        (F.cross_entropy(out.logits.flatten(0, 1), tokens.flatten()) + out.balance_loss).backward()

    for step in (vgg_step, lm_step):
        torch.manual_seed(1)  # the same routing and dropout in both runs
        with FlopCounterMode(display=False) as reference:
            step()
        torch.manual_seed(1)
        _, flops = count_flops(step)
        assert flops == reference.get_total_flops() > 0
