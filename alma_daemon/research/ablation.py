"""Sequential vs. i.i.d. training (paper section 6.2, table 1): is learning chunk by chunk harder?

The same learner (same config, same seed, so the same initial weights) sees the first k chunks of
the stream twice, through the same engine:

* sequential: one training stage per chunk (``policy.wait = 1``), ``train.steps_per_chunk`` steps each;
* i.i.d.: one stage on the union of the k chunks (``policy.wait = k``) with k times the steps,

so both use the same data and the same number of gradient steps; the difference in final test
measure is the cost of the data arriving in order. The compute is equal only for step-budget
learners (the language models) and architectures that do not grow; both runs' FLOPs are reported.
"""

from __future__ import annotations

import dataclasses
import itertools
from typing import Any

from alma_daemon.config import Config, policy_config, to_dict
from alma_daemon.core.records import read_rows
from alma_daemon.measures import task_measure
from alma_daemon.observability.progress import ProgressBar
from alma_daemon.research.simulate import SimulatedStream, build_engine, simulated_stream


def ablate_iid(config: Config, chunks: int, progress: bool = True) -> dict[str, Any]:
    """Train on the first ``chunks`` chunks sequentially and at once; return both runs' results."""
    stream = simulated_stream(config)
    first = list(itertools.islice(stream.chunks, chunks))
    if len(first) < chunks:
        raise ValueError(f"the stream has {len(first)} chunks, fewer than the {chunks} asked for")
    steps = config.train.steps_per_chunk
    settings = {"sequential": (1, steps), "iid": (chunks, chunks * steps)}
    measure = task_measure(stream.task).name
    results: dict[str, Any] = {"chunks": chunks, "measure": measure, "config": to_dict(config)}
    for mode, (wait, mode_steps) in settings.items():
        mode_config = dataclasses.replace(
            config,
            policy=policy_config(name="fixed", wait=wait, grow_every=config.policy.grow_every),
            train=dataclasses.replace(config.train, steps_per_chunk=mode_steps),
        )
        bar = ProgressBar(chunks, enabled=progress)
        engine = build_engine(mode_config, SimulatedStream(stream.task, iter(first), stream.test, chunks), [bar])
        for chunk in first:
            engine.on_chunk(chunk)
        bar.close()
        results[mode] = run_summary(engine.state.series, measure)
    return results


def run_summary(series: list[dict[str, Any]], measure: str) -> dict[str, Any]:
    """Final test measure, steps and FLOPs of one run, plus the test measure after every chunk."""
    records = read_rows(series)
    return {
        f"test_{measure}": records[-1].test,
        f"test_{measure}_per_chunk": [r.test for r in records],
        "steps": sum(r.stage.steps for r in records if r.stage is not None),
        "train_flops": records[-1].cumulative_train_flops,
        "stages": sum(1 for r in records if r.trained),
    }
