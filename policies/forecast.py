"""forecast: learn from the stream how the error falls with data, and train when a stage pays for itself.

``adaptive`` with two parts learned from the stream instead of fixed (docs/policies.md has the figures):

1. **The learning curve, with its uncertainty.** Each model's mean prequential error over the chunks
   it served (the live model's so far) is one point of the stream's learning curve: the error of a
   model trained on N chunks. A power law ``error ~ N^-c`` is fit to the recent points (Bayesian least
   squares on log error against log N, each point weighted by its binomial variance, the slope's
   prior c ~ 0.3 +- 0.3), so the forecast carries the slope's standard deviation: wide after two
   stages, narrow after ten.
2. **The wait that minimizes the forecast anytime error.** Waiting longer leaves a stale model in
   use for longer (the steeper the curve, the dearer); training on fewer chunks at a time fits the
   stream worse (a stage of P chunks after N trains as if on ``N * r / (r + k)``, r = P / N, with
   ``policy.stage_penalty`` k). The ratio r that minimizes the forecast CER per unit of log time is
   the wait, as in ``geometric``. It moves little with the slope, much with k: one stream cannot tell
   k (every stage of one schedule has about the same r), so k is a constant, chosen on some seeds
   and settings and judged on others (benchmarks/bench_policy.py).
3. **A price on compute.** With ``policy.compute_price`` p > 0 (CER units per FLOP), a stage runs
   only when its forecast gain, summed over the chunks it will serve, is worth its FLOPs:
   ``(gain + 1 sd) x H >= p x FLOPs``. H is the chunks still to come: ``policy.expected_chunks`` less
   those seen, or where the length is unknown, the chunks seen so far (a stream is expected to go on
   as long again as it has run). Optimism by one standard deviation
   keeps a flat start (CIFAR-10's first stages) from stopping training before the curve is known.
   As the stream ages H grows, so a held stage runs once it pays.

Drifts, growth and the reasons are ``adaptive``'s: a drift trains at once, whatever the price, and
starts the curve again.
"""

from __future__ import annotations

import math
from typing import Any, Literal

from pydantic import Field
from pydantic.dataclasses import dataclass

from alma_daemon.config.base import PLUGIN_SECTION, Float, Int
from policies.adaptive import Adaptive, AdaptiveConfig
from policies.base import PolicyState
from policies.measure_scale import ChunkMeasures, MeasureScale

#: The slope's prior: learning curves of the paper's settings fall as N^-0.1 (CIFAR-10) to N^-0.5 (MNIST).
PRIOR_SLOPE = 0.3
PRIOR_SLOPE_SD = 0.3
#: The curve is fit on the stages whose models trained on at least 1/CURVE_SPAN of the newest's chunks:
#: learning curves bend (flat starts, plateaus), so the local slope is the one that forecasts.
CURVE_SPAN = 16
#: Standard deviation of a stage's log error around the power law, beyond its sampling noise.
MISFIT_SD = 0.05
#: The price test takes the gain this many standard deviations above its forecast.
OPTIMISM = 1.0
#: k chosen on MNIST SM 4, SM 64 and Ens, seeds 0-2: the lowest mean CER ratio to the best schedule of
#: k in {0.1, 0.2, 0.5, 1, 2} (benchmarks/results/policy37_tune.md); judged on other seeds and settings.
DEFAULT_STAGE_PENALTY = 0.2
#: Candidate ratios of the wait: 0.05 to 8, evenly spaced in log.
_RATIOS = [0.05 * 160 ** (i / 199) for i in range(200)]


@dataclass(frozen=True)
class Slope:
    """The learning curve's fitted slope c (error ~ N^-c), its standard deviation and the points it is fit on."""

    mean: float
    sd: float
    points: int

    def gain(self, level: float, trained: int, pending: int) -> tuple[float, float]:
        """Forecast fall of ``level`` (the live model's error) from training on ``pending`` more chunks after
        ``trained``, and its standard deviation (delta method on the slope)."""
        growth = 1 + pending / trained
        kept = growth**-self.mean
        return level * (1 - kept), level * kept * math.log(growth) * self.sd


def anytime_excess(ratio: float, slope: float, penalty: float) -> float:
    """CER of waiting ``ratio`` x N between stages, relative to a model always trained on everything so
    far, under ``error ~ N^-slope`` with the stage penalty: per unit of log time, the same in every period."""
    slope = min(max(slope, 0.01), 0.95)
    stale = ((1 + ratio) ** (1 - slope) - 1) / (1 - slope)
    return ratio * ((ratio + penalty) / ratio) ** slope / stale


def best_ratio(slope: Slope, penalty: float) -> float:
    """The wait's ratio with the lowest forecast anytime error, averaged over the slope's uncertainty."""
    spread = [(slope.mean - slope.sd, 1 / 6), (slope.mean, 4 / 6), (slope.mean + slope.sd, 1 / 6)]
    return min(_RATIOS, key=lambda r: sum(w * anytime_excess(r, c, penalty) for c, w in spread))


class LearningCurve:
    """The live models' mean measures by the chunks they were trained on, since the stream or the last drift."""

    def __init__(self, points: list[Any] | None = None):
        #: (chunks trained on, mean measure, examples measured on), one per closed stage.
        self.points: list[tuple[int, float, int]] = [(int(n), float(v), int(e)) for n, v, e in points or []]

    def add(self, trained: int, errors: ChunkMeasures) -> None:
        if trained > 0 and errors.chunks and errors.mean > 0:
            self.points.append((trained, errors.mean, errors.examples))

    def slope(self, scale: MeasureScale, live: tuple[int, float, int] | None = None) -> Slope:
        """Bayesian least squares of log measure = a - c log N over the recent points and the ``live``
        model's (chunks trained on, mean measure so far, examples), with c's prior."""
        points = [*self.points, live] if live else self.points
        recent = [p for p in points if p[0] * CURVE_SPAN >= points[-1][0]] if points else []
        # Normal equations for (a, c), row (1, -log N); a's prior is flat, c's is PRIOR_SLOPE +- PRIOR_SLOPE_SD.
        prior = 1 / PRIOR_SLOPE_SD**2
        saa, sac, scc = 1e-6, 0.0, prior
        ya, yc = 0.0, prior * PRIOR_SLOPE
        for trained, value, examples in recent:
            # A mean loss's spread is not kept per point: its coefficient of variation is taken as 1.
            weight = 1 / (scale.variance(value, examples) / value**2 + MISFIT_SD**2)
            x, y = -math.log(trained), math.log(value)
            saa, sac, scc = saa + weight, sac + weight * x, scc + weight * x * x
            ya, yc = ya + weight * y, yc + weight * x * y
        det = saa * scc - sac * sac
        mean = (saa * yc - sac * ya) / det
        return Slope(mean=mean, sd=math.sqrt(saa / det), points=len(recent))


@dataclass(config=PLUGIN_SECTION)
class ForecastConfig(AdaptiveConfig):
    """forecast: adaptive's drift and growth rules, with the wait and the price test learned from the
    stream's learning curve."""

    name: Literal["forecast"] = "forecast"  # type: ignore[assignment]
    compute_price: Float = Field(
        default=0.0,
        ge=0,
        description="forecast: CER units one training FLOP is worth (0 = anytime error alone). A stage runs only when "
        "its forecast gain over the chunks it will serve (expected_chunks less those seen; unset, as many as the stream has "
        "had) outweighs price x its FLOPs.",
    )
    expected_chunks: Int | None = Field(
        default=None,
        gt=0,
        description="forecast: the chunks the stream is expected to bring in all, for the price test's horizon (a "
        "model replaced in three months, a replay of known length); None = unknown: the stream is expected to go on "
        "as long again as it has run.",
    )
    stage_penalty: Float = Field(
        default=DEFAULT_STAGE_PENALTY,
        gt=0,
        description="forecast: how much worse a model fits when trained in small stages (k; chosen on benchmark "
        "seeds, docs/policies.md). Larger k waits longer.",
    )


class Forecast(Adaptive):
    """Fits the stream's learning curve after each stage; waits the ratio of chunks trained on that
    minimizes the forecast anytime error; with a compute price, trains only when the stage pays."""

    name = "forecast"
    config_model = ForecastConfig

    def __init__(self, config: ForecastConfig):
        super().__init__(config)
        self.compute_price = config.compute_price
        self.expected_chunks = config.expected_chunks
        self.stage_penalty = config.stage_penalty
        self.curve = LearningCurve()

    @classmethod
    def contract_configs(cls) -> list[dict[str, Any]]:
        return [{}, {"compute_price": 1e-12}, {"drift_detector": "page_hinkley", "stage_penalty": 2.0}]

    def state_dict(self) -> dict[str, Any]:
        return {**super().state_dict(), "curve": [list(p) for p in self.curve.points]}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)
        self.curve = LearningCurve(state.get("curve"))

    def _slope(self, scale: MeasureScale) -> Slope:
        # The live model is measured on every chunk it serves: its mean so far is the curve's newest point.
        measured = self.trained > 0 and self.live.chunks and self.live.mean > 0
        live = (self.trained, self.live.mean, self.live.examples) if measured else None
        return self.curve.slope(scale, live)

    def wait_ratio(self, scale: MeasureScale) -> float:
        return best_ratio(self._slope(scale), self.stage_penalty)

    def stage_closed(self, trained: int, live: ChunkMeasures, scale: MeasureScale) -> None:
        self.curve.add(trained, live)

    def regime_started(self) -> None:
        self.curve = LearningCurve()

    def stage_pays(self, state: PolicyState, scale: MeasureScale, estimates: dict[str, float]) -> tuple[bool, str]:
        slope = self._slope(scale)
        ratio = best_ratio(slope, self.stage_penalty)
        estimates.update(forecast_slope=slope.mean, forecast_slope_sd=slope.sd, wait_ratio=ratio)
        text = (
            f"learning curve N^-{slope.mean:.2f} +- {slope.sd:.2f} (fit on {slope.points} model(s)): "
            f"a wait of {ratio:.2f} x the chunks trained on has the lowest forecast anytime error"
        )
        price = self.compute_price
        level = self.live.mean if self.live.chunks else (self.curve.points[-1][1] if self.curve.points else None)
        if price == 0 or self.trained == 0 or level is None or state.flops_per_example is None:
            return True, text
        gain, spread = slope.gain(level, self.trained, state.chunks_pending)
        estimates.update(forecast_gain=gain, forecast_gain_sd=spread)
        expected = self.expected_chunks
        if expected is None:
            horizon, whence = state.chunks_seen, "as many as so far"
        else:
            horizon, whence = max(0, expected - state.chunks_seen), f"of the {expected} expected"
        worth = (gain + OPTIMISM * spread) * horizon
        flops = state.flops_per_example * (state.next_stage_examples or state.examples_pending)
        cost = price * flops
        pays = worth >= cost
        text += (
            f"; forecast gain {gain:.4f} +- {spread:.4f} over {horizon} chunk(s) to come ({whence}) is "
            f"worth {worth:.3g} CER {'>=' if pays else '<'} price x {flops:.3g} FLOPs = {cost:.3g}"
            + ("" if pays else ": waiting until the stage pays")
        )
        return pays, text
