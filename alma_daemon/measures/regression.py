"""A regression's measures: mean squared and mean absolute error of the predicted number."""

from __future__ import annotations

import torch

from alma_daemon.config.measure_traits import MAE, MSE
from alma_daemon.measures.base import Measure, Measurement, mean_measurement, on_cpu


class RegressionMeasure(Measure):
    """A mean of per-example losses of a prediction (N) against a float target (N)."""

    @staticmethod
    def term(error: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    @on_cpu
    def measure(self, outputs: torch.Tensor, y: torch.Tensor) -> Measurement:
        losses, _ = self.per_example(outputs, y)
        return mean_measurement(losses, rate=False)

    def per_example(self, outputs: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        losses = self.term(outputs.cpu().double().reshape(-1) - y.cpu().double().reshape(-1))
        return losses, torch.ones_like(losses, dtype=torch.bool)


class MeanSquaredError(RegressionMeasure):
    """The mean of the squared differences between prediction and target."""

    name = "mse"
    traits = MSE
    description = "regression: mean squared error of the prediction"

    @staticmethod
    def term(error: torch.Tensor) -> torch.Tensor:
        return error.square()

    def constant_outputs(self, y: torch.Tensor) -> torch.Tensor:
        return torch.full((len(y),), float(y.double().mean()), dtype=torch.float64)


class MeanAbsoluteError(RegressionMeasure):
    """The mean of the absolute differences between prediction and target."""

    name = "mae"
    traits = MAE
    description = "regression: mean absolute error of the prediction"

    @staticmethod
    def term(error: torch.Tensor) -> torch.Tensor:
        return error.abs()

    def constant_outputs(self, y: torch.Tensor) -> torch.Tensor:
        return torch.full((len(y),), float(y.double().median()), dtype=torch.float64)
