"""A team's own network, named in config as ``learner.model: "package.module:factory"``.

The factory takes the task (:class:`~alma_daemon.data.datasets.TaskInfo`: input shape, classes) and
returns an ``nn.Module`` mapping a batch of inputs, float32 as the task's normalization leaves them
(``(N, *input_shape)``; images NCHW), to logits ``(N, num_classes)``, or for a regression to one output
``(N, 1)`` (``task.num_classes`` is 1: the prediction of the standardized target, or of the target as it is
when the network starts from its deployed weights, docs/your-model.md). It is called under a seeded RNG,
once per ensemble member, so it should draw its initial weights from torch's default generator.

The module is imported from an installed package or from the working directory. It becomes the
layers of a :class:`~alma_daemon.models.backbones.Backbone`: an ``nn.Sequential``'s children one
layer each (so gMoE can make its first two layers mixtures, and an MLP of Flatten/Linear/ReLU
trains stacked with its ensemble), any other module one layer.
"""

from __future__ import annotations

import importlib
import os
import sys
from collections.abc import Callable, Mapping
from typing import Any

import torch
from torch import nn

from alma_daemon.config import ConfigError
from alma_daemon.data.datasets import TaskInfo
from alma_daemon.models.backbones import Backbone, Normalize

Factory = Callable[[TaskInfo], nn.Module]


def import_factory(path: str) -> Factory:
    """The factory ``path`` names (``"package.module:function"``), or a one-line :class:`ConfigError`."""
    module_name, _, attribute = path.partition(":")
    if not module_name or not attribute:
        raise ConfigError(f"learner.model: {path!r} must name a factory as 'package.module:function'")
    if os.getcwd() not in sys.path:
        sys.path.append(os.getcwd())
    try:
        module = importlib.import_module(module_name)
    except ImportError as err:
        raise ConfigError(
            f"learner.model: cannot import {module_name!r} ({err}); run from the folder that holds it or install its package"
        ) from None
    factory = getattr(module, attribute, None)
    if not callable(factory):
        raise ConfigError(f"learner.model: {module_name!r} has no callable {attribute!r}")
    return factory


def user_layers(task: TaskInfo, path: str) -> list[nn.Module]:
    """The layers of the factory's network for ``task``, its output shape checked on two examples."""
    net = import_factory(path)(task)
    if not isinstance(net, nn.Module):
        raise ConfigError(f"learner.model: {path} returned a {type(net).__name__}, not a torch.nn.Module")
    _check_output(net, task, path)
    return list(net) if isinstance(net, nn.Sequential) else [net]


def _check_output(net: nn.Module, task: TaskInfo, path: str) -> None:
    was_training = net.training
    net.eval()
    try:
        with torch.no_grad():
            out = net(Normalize(task)(torch.zeros(2, *task.input_shape)))
    except Exception as err:  # any failure of the user's forward is reported in one line
        raise ConfigError(
            f"learner.model: {path} fails on a batch of shape {[2, *task.input_shape]}: {type(err).__name__}: {err}"
        ) from None
    finally:
        net.train(was_training)
    if not isinstance(out, torch.Tensor) or tuple(out.shape) != (2, task.num_classes):
        got = list(out.shape) if isinstance(out, torch.Tensor) else type(out).__name__
        expected = (
            "outputs of shape [2, 1] (one prediction per example)"
            if task.regression
            else (f"logits of shape [2, {task.num_classes}] (the task's classes)")
        )
        raise ConfigError(
            f"learner.model: {path} maps a batch of shape {[2, *task.input_shape]} to {got}; expected {expected}"
        )


def user_module_of(net: Backbone, state: Mapping[str, torch.Tensor]) -> nn.Module:
    """The part of ``net`` that the factory's module's weights ``state`` fit: its layers (the keys of a
    factory's ``nn.Sequential`` are theirs), or its one layer when the factory returned another module
    (whose keys do not start with the index ``0.``)."""
    layers = net.layers
    if len(layers) == 1 and not any(key.startswith("0.") for key in state):
        return layers[0]
    return layers


def load_user_weights(net: Backbone, state: Mapping[str, torch.Tensor], source: str) -> None:
    """Load a factory module's weights into ``net``, or raise one line saying which keys do not fit."""
    target = user_module_of(net, state)
    own = target.state_dict()
    missing = sorted(own.keys() - state.keys())
    unexpected = sorted(state.keys() - own.keys())
    wrong = sorted(k for k in own.keys() & state.keys() if tuple(own[k].shape) != tuple(state[k].shape))
    if missing or unexpected or wrong:
        parts = [
            f"{what} {_few(keys)}"
            for what, keys in (("missing", missing), ("unexpected", unexpected), ("of another shape", wrong))
            if keys
        ]
        raise ConfigError(f"learner.init_weights: {source} does not fit learner.model: keys {'; '.join(parts)}")
    target.load_state_dict(dict(state))


def _few(keys: list[Any]) -> str:
    return ", ".join(map(str, keys[:4])) + (f" and {len(keys) - 4} more" if len(keys) > 4 else "")
