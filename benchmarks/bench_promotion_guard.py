"""The promotion guard on ``examples/service.yaml``'s stream: how often it refuses on noise, and a truly worse version.

The stream is the one ``alma run --config examples/service.yaml`` trains on: MNIST in 500 chunks of
120 examples, 12 of each held out for validation, SM of width 64, one stage per chunk (``policy``
fixed, wait 1), so one version per chunk whose own validation sample is 12 examples. The engine runs
in process over an in-memory buffer (the simulator's path; the daemon runs the same engine) and
writes each version to a model store, as the daemon does. Each guard setting then decides on every
version with the publisher's own guard (``Publisher.guard``), keeping its own live version:

- **stationary**: the version the engine wrote. The stream does not change, so a refusal is the
  guard crying wolf unless the version is truly worse (fine-tuning on 108 examples sometimes makes
  it so): each refused version and its live version are measured on MNIST's 10,000 test examples;
- **truly worse**: a twin of the same version, trained from the same previous version on the same
  chunk, but with the chunk's labels permuted (the seeded derangement of ``stream.drift.kind:
  permute_labels``), and guarded with the same honest validation sample. Every twin should be refused;
- **drift** (``--drift-chunks``): a second stream whose labels are permuted from chunk
  ``--drift-at`` on (``stream.drift``), where the newest data are right and the older examples of a
  pooled sample out of date: versions after the change should be promoted.

The settings: the guard before the paired test (``promotion_margin`` 0.01 on the version's own
sample: ``promotion_alpha`` 1, ``promotion_min_examples`` 1), the default, and variations of each
key; for the drift stream also the default without the exception for the newest examples
(serving/publishing/guard.py). Seeds set ``seed`` and ``stream.seed``; a run takes about 3 minutes a seed on
one core; the figures are decisions, not timings.

    python benchmarks/bench_promotion_guard.py [--seeds 0 1 2] [--chunks 500] [--drift-at 101] [--drift-chunks 40]

``--imbalanced`` runs a stationary stream with 2 % positives instead (a fraud stream: 10 Gaussian
features, chunks of 500 examples, 50 of each held out, SM of width 32, one version per chunk), and
judges every version with guard settings on the task's measure (error, cost, recall, precision, PR-AUC,
balanced error), with and without the positives' recall test and the top-up to
``promotion_min_positives``. Its bad versions: a twin of every version that never flags a fraud (its
positive output lowered: the same ranking, no alert), and a twin trained on the chunk with its labels
swapped. The measures without a per-example form (precision, PR-AUC, balanced error) are judged by the
paired bootstrap; every setting records the CPU time (``time.process_time``) of each of its guard
decisions and its decisions in order (``decisions``: one character a decision, ``+`` promoted, ``-``
refused), so that two runs' decisions compare exactly. About 15 minutes of CPU a seed on a busy 2-core
machine, half of it the three bootstrap settings' guard:

    python benchmarks/bench_promotion_guard.py --imbalanced [--seeds 0 1 2] [--chunks 200]

``--timing`` times the guard alone, on seeded outputs of two versions for 2,000 examples with 2 %
positives (and a regression's), for every measure: a version as good as the live one and a worse one,
each decided ``--repeats`` times; it writes benchmarks/results/promotion_guard_timing.json in seconds:

    python benchmarks/bench_promotion_guard.py --timing
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import tempfile
import time
from collections.abc import Iterator

import torch
from figures_file import write_figures  # this script's folder is on sys.path when it runs

from alma_daemon.config import Config, build_config, load_config
from alma_daemon.core.assembly import assemble_engine
from alma_daemon.core.checkpoints import CheckpointStore
from alma_daemon.core.chunk_buffer import MemoryBuffer
from alma_daemon.data.datasets import TaskInfo
from alma_daemon.data.streams import Chunk, label_permutation, megabatch_stream, split_chunk
from alma_daemon.data.task_terms import configured_task
from alma_daemon.data.tensors import LabeledData
from alma_daemon.learners import Learner
from alma_daemon.measures import Measure, Target, build_measure, target_of
from alma_daemon.measures.binary import Recall
from alma_daemon.research.simulate import SimulatedStream, labeled_stream
from alma_daemon.seeding import derive_seed
from alma_daemon.training.loop import Trainer
from alma_daemon.training.optim import resolve_optimizer_name
from serving.publishing.guard import PromotionGuard, Verdict
from serving.publishing.local import LocalPublisher
from serving.publishing.publisher import Candidate

SERVICE_CONFIG = "examples/service.yaml"
DEFAULT = PromotionGuard()


@dataclasses.dataclass(frozen=True)
class WithoutNewestException(PromotionGuard):
    """The default guard without its exception for a candidate its own (newest) examples prefer."""

    def judge(self, *args, **kwargs) -> Verdict:
        verdict = super().judge(*args, **kwargs)
        worse = verdict.headline.worse or (verdict.positive_recall is not None and verdict.positive_recall.worse)
        return dataclasses.replace(verdict, promoted=not worse)


def settings(drift: bool) -> dict[str, PromotionGuard]:
    """The guard settings compared, by name: the default, the guard before, and variations of each key."""
    margin, alpha, least = DEFAULT.margin, DEFAULT.alpha, DEFAULT.min_examples
    chosen = {
        "before: margin on the own 12 examples": PromotionGuard(margin, alpha=1.0, min_examples=1),
        "paired test on the own 12 examples": PromotionGuard(margin, alpha, min_examples=1),
        "default": DEFAULT,
        "min_examples 120": PromotionGuard(margin, alpha, min_examples=120),
        "min_examples 600": PromotionGuard(margin, alpha, min_examples=600),
        "alpha 0.01": PromotionGuard(margin, alpha=0.01, min_examples=least),
        "alpha 0.01, min_examples 120": PromotionGuard(margin, alpha=0.01, min_examples=120),
        "alpha 0.05": PromotionGuard(margin, alpha=0.05, min_examples=least),
        "margin 0": PromotionGuard(0.0, alpha, least),
        "margin 0.03": PromotionGuard(0.03, alpha, least),
    }
    if drift:
        chosen["default without the newest-examples exception"] = WithoutNewestException()
    return chosen


class CachedStore(CheckpointStore):
    """The model store, keeping the versions it loaded: every setting asks for the same few live
    versions at every step (the learners are only evaluated, never changed)."""

    def __init__(self, root: str, model_name: str):
        super().__init__(root, model_name)
        self._loaded: dict[int, Learner] = {}

    def load(self, version: int, device: str = "cpu") -> Learner:
        if version not in self._loaded:
            if len(self._loaded) > 32:
                self._loaded.pop(min(self._loaded))
            self._loaded[version] = super().load(version, device)
        return self._loaded[version]


class Tally:
    """One guard setting's live version and counts."""

    def __init__(self, store: CheckpointStore, guard: PromotionGuard, test: LabeledData | None):
        self.publisher = LocalPublisher(store, guard.margin)
        self.publisher.promotion = guard
        self.test = test
        self.live: int | None = None
        self.counts = {"versions": 0, "refused": 0, "twins": 0, "twins_refused": 0}
        self.refused_versions: list[int] = []
        #: Each refusal with the two versions' errors on the 10,000 test examples: was it truly worse?
        self.refusals: list[dict] = []
        self.promoted_versions: list[int] = []
        self.twin_promoted_versions: list[int] = []
        self.twin_errors: list[tuple[float, float]] = []

    def decide(self, candidate: Candidate) -> None:
        outcome = self.publisher.guard(candidate, self.live)
        if outcome.live_before is None:
            self.live = candidate.version
            return
        self.counts["versions"] += 1
        if outcome.action == "promoted":
            self.live = candidate.version
            self.promoted_versions.append(candidate.version)
        else:
            self.counts["refused"] += 1
            self.refused_versions.append(candidate.version)
            refusal = {
                "version": candidate.version,
                "live": outcome.live_before,
                "examples": outcome.examples,
                "error": outcome.candidate_value,
                "live_error": outcome.live_value,
                "p_value": outcome.p_value,
            }
            if self.test is not None:
                store = self.publisher.store
                refusal["test_error"] = store.load(candidate.version).evaluate(self.test)["error"]
                refusal["live_test_error"] = store.load(outcome.live_before).evaluate(self.test)["error"]
            self.refusals.append(refusal)

    def decide_twin(self, twin: Candidate) -> None:
        outcome = self.publisher.guard(twin, self.live)
        self.counts["twins"] += 1
        self.twin_errors.append((outcome.candidate_value or 0.0, outcome.live_value or 0.0))
        if outcome.action == "refused":
            self.counts["twins_refused"] += 1
        else:
            self.twin_promoted_versions.append(twin.version)


def stream_config(seed: int, drift_at: int | None) -> Config:
    overrides = [f"seed={seed}", f"stream.seed={seed}", "device=cpu"]
    if drift_at is not None:
        overrides += ["stream.drift.kind=permute_labels", f"stream.drift.at={drift_at}"]
    return load_config(SERVICE_CONFIG, overrides)


def permuted_twin(config: Config, store: CheckpointStore, chunk: Chunk, version: int, sample: LabeledData) -> Candidate:
    """Version ``version`` as it would be had its chunk's labels been permuted: trained from the same
    previous version on the same split, guarded with the honest validation sample."""
    permutation = label_permutation(store.load(version).task.num_classes, derive_seed(config.seed, "twin"))
    return relabeled_twin(config, store, chunk, version, sample, permutation)


def relabeled_twin(
    config: Config, store: CheckpointStore, chunk: Chunk, version: int, sample: LabeledData, relabel: torch.Tensor
) -> Candidate:
    """Version ``version`` as it would be had its chunk's label ``c`` read ``relabel[c]``: trained from the
    same previous version on the same split, guarded with the honest validation sample."""
    split = split_chunk(chunk, config.stream.val_fraction, config.stream.seed)
    learner = CheckpointStore.load(store, version - 1)  # a copy to train, not the cached one
    trainer = Trainer(
        config.train,
        resolve_optimizer_name(config.train, config.dataset.name),
        torch.device("cpu"),
        seed=derive_seed(config.seed, "twin", version),
        augment=learner.task.augment,
    )
    learner.fit(
        LabeledData(split.train.x, relabel[split.train.y]),
        LabeledData(split.val.x, relabel[split.val.y]),
        trainer,
    )
    return Candidate(version, learner, sample)


def versions_of(
    config: Config, stream: SimulatedStream, store: CheckpointStore, chunks: int
) -> Iterator[tuple[Chunk, int]]:
    """Run the engine over the first ``chunks`` chunks; yield each chunk with the version it wrote."""
    engine = assemble_engine(config, stream.task, MemoryBuffer(), checkpoints=store)
    for i, chunk in enumerate(stream.chunks):
        if i == chunks:
            break
        engine.on_chunk(chunk)
        yield chunk, engine.state.model_version


def run_stream(seed: int, chunks: int, twins_every: int, drift_at: int | None) -> dict:
    config = stream_config(seed, drift_at)
    started = time.time()
    with tempfile.TemporaryDirectory() as folder:
        store = CachedStore(folder, config.serving.model_name)
        stream = labeled_stream(config)
        # A drifted stream's test set changes at the drift: its refusals are not checked against it.
        test = stream.test if drift_at is None else None
        tallies = {name: Tally(store, guard, test) for name, guard in settings(drift_at is not None).items()}
        for chunk, version in versions_of(config, stream, store, chunks):
            first = next(iter(tallies.values())).publisher
            candidate = first.load_candidate(version)
            if drift_at is None and version > 1 and version % twins_every == 0:
                twin = permuted_twin(config, store, chunk, version, candidate.sample)
                for tally in tallies.values():
                    tally.decide_twin(twin)
            for tally in tallies.values():
                tally.decide(candidate)
    result: dict = {"seed": seed, "chunks": chunks, "seconds": round(time.time() - started, 1), "settings": {}}
    for name, tally in tallies.items():
        row: dict = dict(tally.counts)
        if drift_at is not None:
            after = [v for v in range(drift_at, chunks + 1)]
            row["after_drift"] = len(after)
            row["refused_after_drift"] = sum(v in tally.refused_versions for v in after)
            promoted_after = [v for v in tally.promoted_versions if v >= drift_at]
            row["first_promoted_after_drift"] = promoted_after[0] if promoted_after else None
        else:
            row["refusals"] = tally.refusals
            row["twins_promoted"] = tally.twin_promoted_versions
            if tally.twin_errors:
                twins = len(tally.twin_errors)
                row["twin_error_mean"] = sum(c for c, _ in tally.twin_errors) / twins
                row["live_error_mean_beside_twins"] = sum(live for _, live in tally.twin_errors) / twins
        result["settings"][name] = row
    return result


def summary(runs: list[dict], drift: bool) -> dict:
    """Each setting's counts over ``runs``; for the stationary streams, its refusals checked against
    the test set too (``not_worse_on_test``: crying wolf)."""
    totals: dict = {}
    counted = ("after_drift", "refused_after_drift") if drift else ("versions", "refused", "twins", "twins_refused")
    for run in runs:
        for name, row in run["settings"].items():
            total = totals.setdefault(name, dict.fromkeys(counted, 0))
            for key in counted:
                total[key] += row[key]
            if drift:
                total.setdefault("first_promoted_after_drift", []).append(row["first_promoted_after_drift"])
                continue
            refusals = row["refusals"]
            total["refused_not_worse_on_test"] = total.get("refused_not_worse_on_test", 0) + sum(
                r["test_error"] <= r["live_test_error"] for r in refusals
            )
            total["refused_worse_on_test_by_more_than_0.01"] = total.get(
                "refused_worse_on_test_by_more_than_0.01", 0
            ) + sum(r["test_error"] > r["live_test_error"] + 0.01 for r in refusals)
    for total in totals.values():
        if drift:
            total["refused_after_drift_share"] = total["refused_after_drift"] / max(1, total["after_drift"])
        else:
            total["refused_share"] = total["refused"] / max(1, total["versions"])
            total["twins_refused_share"] = total["twins_refused"] / max(1, total["twins"])
    return totals


# -- the imbalanced stream (--imbalanced) ---------------------------------------------------------------
#: The fraud stream: 10 Gaussian features, 2 % positives whose mean is moved along 4 of them so that
#: the classes' means lie FRAUD_SEPARATION apart. A model thresholding at 1/2, as served answers do,
#: then finds about 0.74 of the frauds at best (Bayes), with about 0.2 % false alarms.
FRAUD_SHARE = 0.02
FRAUD_FEATURES = 10
FRAUD_SEPARATION = 3.5
FRAUD_TEST_EXAMPLES = 20_000
#: A missed fraud's cost against a false alarm's, for the cost setting.
MISSED_FRAUD_COST = 10.0

#: The guard settings of the imbalanced stream: the task's measure the guard judges on, and the guard.
IMBALANCED_SETTINGS: dict[str, tuple[str, PromotionGuard]] = {
    "before: error alone, 300 examples": ("error", PromotionGuard(min_positives=0, positive_recall=False)),
    "default: error and the positives' recall, 30 positives": ("error", DEFAULT),
    "the positives' recall on 300 examples (no top-up)": ("error", PromotionGuard(min_positives=0)),
    "60 positives": ("error", PromotionGuard(min_positives=60)),
    "cost (a missed fraud 10, a false alarm 1)": ("cost", DEFAULT),
    "recall": ("recall", DEFAULT),
    # The measures the guard tests by the paired bootstrap.
    "precision": ("precision", DEFAULT),
    "pr_auc": ("pr_auc", DEFAULT),
    "balanced_error": ("balanced_error", DEFAULT),
}


def fraud_examples(n: int, seed: int) -> LabeledData:
    g = torch.Generator().manual_seed(seed)
    y = (torch.rand(n, generator=g) < FRAUD_SHARE).long()
    x = torch.randn(n, FRAUD_FEATURES, generator=g)
    x[:, :4] += FRAUD_SEPARATION / 2 * y.view(-1, 1).float()  # 4 moves of s/2: the means lie s apart
    return LabeledData(x, y)


def fraud_config(seed: int, chunks: int) -> Config:
    return build_config(
        {
            "seed": seed,
            "device": "cpu",
            "dataset": {"normalization": "standardize"},
            "task": {"classes": ["ok", "fraud"]},
            "stream": {"megabatches": chunks, "seed": seed},
            "learner": {"name": "sm", "width": 32},
            "policy": {"name": "fixed", "wait": 1},
        }
    )


def fraud_stream(config: Config, chunk_examples: int) -> SimulatedStream:
    """The stationary fraud stream: ``stream.megabatches`` chunks of ``chunk_examples`` examples."""
    task = configured_task(TaskInfo("classification", (FRAUD_FEATURES,), 2, normalization="standardize"), config)
    chunks = config.stream.megabatches
    data = fraud_examples(chunks * chunk_examples, derive_seed(config.seed, "fraud", "stream"))
    test = fraud_examples(FRAUD_TEST_EXAMPLES, derive_seed(config.seed, "fraud", "test"))
    return SimulatedStream(task, megabatch_stream(data, chunks, config.stream.seed), test, chunks)


class ImbalancedTally:
    """One guard setting's live version and counts on the fraud stream. It decides as
    ``Publisher.guard`` does (the publisher's guard sample, :meth:`PromotionGuard.judge`), on the
    setting's measure instead of the task's."""

    def __init__(self, store: CachedStore, measure: Measure, guard: PromotionGuard, test: LabeledData):
        self.publisher = LocalPublisher(store, guard.margin)
        self.publisher.promotion = guard
        self.store, self.measure, self.guard, self.test = store, measure, guard, test
        self.live: int | None = None
        self.counts = dict.fromkeys(
            (
                "versions",
                "refused",
                "short_of_positives",
                "never_flag",
                "never_flag_refused",
                "never_flag_short_of_positives",
                "never_flag_short_of_positives_refused",
                "permuted",
                "permuted_refused",
            ),
            0,
        )
        self.refusals: list[dict] = []
        #: The first few bad twins promoted although the guard sample held the positives it wants.
        self.twins_promoted: list[dict] = []
        self.positives: list[int] = []
        #: Every decision in order, "+" promoted and "-" refused: two runs' decisions compare exactly.
        self.decisions: list[str] = []
        #: Each decision's CPU seconds in ``PromotionGuard.judge`` and its guard sample's size.
        self.cpu_seconds: list[float] = []
        self.examples: list[int] = []

    def verdict(self, candidate: Candidate) -> Verdict:
        sample = self.publisher.guard_sample(candidate)
        assert self.live is not None
        live = self.store.load(self.live)
        outputs, live_outputs = candidate.learner.outputs(sample), live.outputs(sample)
        # The guard's own time, the models' answers aside: what a publish waits for beyond them.
        started = time.process_time()
        verdict = self.guard.judge(self.measure, outputs, live_outputs, sample.y, len(candidate.sample))
        self.cpu_seconds.append(time.process_time() - started)
        self.examples.append(len(sample))
        self.decisions.append("+" if verdict.promoted else "-")
        return verdict

    def decide(self, candidate: Candidate) -> None:
        if self.live is None:
            self.live = candidate.version
            return
        verdict = self.verdict(candidate)
        self.counts["versions"] += 1
        self.positives.append(verdict.positives or 0)
        self.counts["short_of_positives"] += (verdict.positives or 0) < self.guard.min_positives
        if verdict.promoted:
            self.live = candidate.version
            return
        self.counts["refused"] += 1
        self.refusals.append(
            {
                "version": candidate.version,
                "live": self.live,
                "reason": verdict.reason,
                "test": self.on_test(candidate.learner),
                "live_test": self.on_test(self.store.load(self.live)),
            }
        )

    def decide_twin(self, twin: Candidate, kind: str) -> None:
        verdict = self.verdict(twin)
        short = kind == "never_flag" and (verdict.positives or 0) < self.guard.min_positives
        for count in (kind, f"{kind}_short_of_positives") if short else (kind,):
            self.counts[count] += 1
            self.counts[f"{count}_refused"] += not verdict.promoted
        if verdict.promoted and not short and len(self.twins_promoted) < 5:
            self.twins_promoted.append({"kind": kind, "version": twin.version, "reason": verdict.reason})

    def on_test(self, learner: Learner) -> dict[str, float]:
        """The learner's setting measure and recall of the frauds on the 20,000 test examples."""
        outputs = learner.outputs(self.test)
        recall = Recall(self.measure.target).measure(outputs, self.test.y).value
        return {self.measure.name: self.measure.measure(outputs, self.test.y).value, "recall": recall}


def never_flagging_twin(store: CheckpointStore, version: int, sample: LabeledData) -> Candidate:
    """Version ``version`` with its positive class's output lowered so far that it flags no example: the
    same ranking (its PR-AUC unchanged), no fraud ever reported (its error only the frauds' 2 % worse)."""
    learner = CheckpointStore.load(store, version)  # a copy to change, not the cached one
    output = [m for m in learner.model.modules() if isinstance(m, torch.nn.Linear)][-1]
    with torch.no_grad():
        output.bias[learner.task.positive] -= 1e4
    return Candidate(version, learner, sample)


def run_fraud_stream(seed: int, chunks: int, chunk_examples: int, twins_every: int) -> dict:
    config = fraud_config(seed, chunks)
    started = time.time()
    with tempfile.TemporaryDirectory() as folder:
        store = CachedStore(folder, config.serving.model_name)
        stream = fraud_stream(config, chunk_examples)
        assert stream.test is not None
        target = dataclasses.replace(target_of(stream.task), false_negative_cost=MISSED_FRAUD_COST)
        tallies = {
            name: ImbalancedTally(store, build_measure(measure, target), guard, stream.test)
            for name, (measure, guard) in IMBALANCED_SETTINGS.items()
        }
        swapped = label_permutation(2, derive_seed(config.seed, "twin"))
        live_recalls = []
        for chunk, version in versions_of(config, stream, store, chunks):
            first = next(iter(tallies.values())).publisher
            candidate = first.load_candidate(version)
            if version > 1 and version % twins_every == 0:
                twins = {
                    "never_flag": never_flagging_twin(store, version, candidate.sample),
                    "permuted": relabeled_twin(config, store, chunk, version, candidate.sample, swapped),
                }
                for kind, twin in twins.items():
                    for tally in tallies.values():
                        tally.decide_twin(twin, kind)
            for tally in tallies.values():
                tally.decide(candidate)
            if version % 10 == 0:
                live_recalls.append(tallies["recall"].on_test(candidate.learner)["recall"])
    result: dict = {
        "seed": seed,
        "chunks": chunks,
        "seconds": round(time.time() - started, 1),
        "test_recall_every_10th_version": live_recalls,
        "settings": {},
    }
    for name, tally in tallies.items():
        result["settings"][name] = {
            **tally.counts,
            "positives_mean": sum(tally.positives) / max(1, len(tally.positives)),
            "guard_cpu_seconds": cpu_figures(tally.cpu_seconds, tally.examples),
            "decisions": "".join(tally.decisions),
            "refusals": tally.refusals,
            "twins_promoted": tally.twins_promoted,
        }
    return result


def cpu_figures(seconds: list[float], examples: list[int]) -> dict[str, float]:
    """The mean, the largest and the total of decisions' CPU seconds, and the largest guard sample."""
    return {
        "mean": sum(seconds) / max(1, len(seconds)),
        "max": max(seconds, default=0.0),
        "total": sum(seconds),
        "examples_max": max(examples, default=0),
    }


def imbalanced_summary(runs: list[dict]) -> dict:
    """Each setting's counts over ``runs``, its refusals checked against the test set: ``not_worse_on_test``
    where the refused version's measure and recall on the 20,000 test examples are no worse than the live
    version's (crying wolf)."""
    totals: dict = {}
    for run in runs:
        for name, row in run["settings"].items():
            total = totals.setdefault(name, {"measure": IMBALANCED_SETTINGS[name][0], "refused_not_worse_on_test": 0})
            for key, value in row.items():
                if isinstance(value, int):
                    total[key] = total.get(key, 0) + value
            measure = build_measure(total["measure"], Target("binary", 2))
            total["refused_not_worse_on_test"] += sum(
                measure.loss(r["test"][total["measure"]]) <= measure.loss(r["live_test"][total["measure"]])
                and r["test"]["recall"] >= r["live_test"]["recall"]
                for r in row["refusals"]
            )
    for name, total in totals.items():
        total["refused_share"] = total["refused"] / max(1, total["versions"])
        seconds = [run["settings"][name]["guard_cpu_seconds"] for run in runs]
        decisions = sum(len(run["settings"][name]["decisions"]) for run in runs)
        total["guard_cpu_seconds"] = {
            "mean": sum(s["total"] for s in seconds) / max(1, decisions),
            "max": max(s["max"] for s in seconds),
            "examples_max": max(s["examples_max"] for s in seconds),
        }
    return totals


def run_imbalanced(args: argparse.Namespace) -> None:
    load_before = os.getloadavg()
    runs = []
    for seed in args.seeds:
        run = run_fraud_stream(seed, args.chunks, args.chunk_examples, args.twins_every)
        runs.append(run)
        print(f"fraud stream, seed {seed} ({run['seconds']} s):")
        for name, row in run["settings"].items():
            print(
                f"  {name}: refused {row['refused']} of {row['versions']} versions; never-flag twins refused "
                f"{row['never_flag_refused']} of {row['never_flag']}, permuted {row['permuted_refused']} of {row['permuted']}; "
                f"guard CPU {row['guard_cpu_seconds']['mean']:.3f} s a decision, at most {row['guard_cpu_seconds']['max']:.3f} s"
            )
    totals = imbalanced_summary(runs)
    results = {
        "stream": {
            "features": FRAUD_FEATURES,
            "positive_share": FRAUD_SHARE,
            "separation": FRAUD_SEPARATION,
            "chunk_examples": args.chunk_examples,
            "val_fraction": fraud_config(0, args.chunks).stream.val_fraction,
            "learner": "sm width 32, policy fixed wait 1",
            "test_examples": FRAUD_TEST_EXAMPLES,
            "missed_fraud_cost": MISSED_FRAUD_COST,
        },
        "default_guard": dataclasses.asdict(DEFAULT),
        "totals": totals,
        "runs": runs,
    }
    write_figures(args.out or "benchmarks/results/promotion_guard_imbalanced.json", results, load_before)


# -- the guard's own time (--timing) ------------------------------------------------------------------
#: The guard sample the issue timed: 2,000 examples, 2 % positives, the candidate's own 50 first.
TIMING_EXAMPLES = 2_000
TIMING_OWN = 50
TIMING_MEASURES = ("error", "cost", "recall", "log_loss", "precision", "pr_auc", "balanced_error", "mse", "mae")


def fraud_scores(y: torch.Tensor, skill: float, g: torch.Generator) -> torch.Tensor:
    """Probabilities (N x 2) of a version that finds about 0.7 of the positives at skill 4.5 and raises
    few false alarms; a lower skill finds fewer."""
    logit = torch.randn(len(y), generator=g, dtype=torch.float64) - 4.0 + skill * y
    p = torch.sigmoid(logit)
    return torch.stack([1 - p, p], 1)


def timing_versions(measure: str, seed: int) -> tuple[Measure, torch.Tensor, dict[str, torch.Tensor], torch.Tensor]:
    """The measure, the live version's outputs, a version as good and a worse one, and the labels."""
    g = torch.Generator().manual_seed(seed)
    if measure in ("mse", "mae"):
        y = torch.randn(TIMING_EXAMPLES, generator=g, dtype=torch.float64)

        def noisy(scale: float) -> torch.Tensor:
            return y + scale * torch.randn(TIMING_EXAMPLES, generator=g, dtype=torch.float64)

        return build_measure(measure, Target("regression")), noisy(0.5), {"as good": noisy(0.5), "worse": noisy(0.7)}, y
    y = (torch.rand(TIMING_EXAMPLES, generator=g) < FRAUD_SHARE).long()
    target = Target("binary", 2, classes=("ok", "fraud"), positive=1, false_negative_cost=MISSED_FRAUD_COST)
    live = fraud_scores(y, 4.5, g)
    candidates = {"as good": fraud_scores(y, 4.5, g), "worse": fraud_scores(y, 3.0, g)}
    return build_measure(measure, target), live, candidates, y


def time_guard(repeats: int, seed: int) -> dict:
    """Each measure's guard decisions on the timing sample: CPU seconds of each repeat, the headline test."""
    figures: dict = {}
    for name in TIMING_MEASURES:
        measure, live, candidates, y = timing_versions(name, seed)
        for case, candidate in candidates.items():
            seconds = []
            for _ in range(repeats):
                started = time.process_time()
                verdict = DEFAULT.judge(measure, candidate, live, y, TIMING_OWN)
                seconds.append(time.process_time() - started)
            figures.setdefault(name, {})[case] = {
                "cpu_seconds": seconds,
                "test": verdict.headline.test.name,
                "p_value": verdict.headline.test.p_value,
                "promoted": verdict.promoted,
            }
            print(
                f"  {name}, {case}: {max(seconds):.3f} s CPU at most ({verdict.headline.test.name} "
                f"p = {verdict.headline.test.p_value:.3g}, {'promoted' if verdict.promoted else 'refused'})"
            )
    return figures


def run_timing(args: argparse.Namespace) -> None:
    load_before = os.getloadavg()
    results = {
        "examples": TIMING_EXAMPLES,
        "own_examples": TIMING_OWN,
        "positive_share": FRAUD_SHARE,
        "default_guard": dataclasses.asdict(DEFAULT),
        "repeats": args.repeats,
        "runs": [{"seed": seed, "measures": time_guard(args.repeats, seed)} for seed in args.seeds],
    }
    write_figures(args.out or "benchmarks/results/promotion_guard_timing.json", results, load_before)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, nargs="*", default=[0, 1, 2])
    parser.add_argument(
        "--imbalanced", action="store_true", help="the stationary fraud stream (2 %% positives) instead of MNIST's"
    )
    parser.add_argument(
        "--chunks", type=int, default=None, help="chunks of each stationary stream (MNIST: 500, all; fraud stream: 200)"
    )
    parser.add_argument(
        "--timing", action="store_true", help="time the guard alone on 2,000 examples for every measure"
    )
    parser.add_argument("--repeats", type=int, default=3, help="--timing: decisions timed per measure and case")
    parser.add_argument("--chunk-examples", type=int, default=500, help="fraud stream: examples per chunk")
    parser.add_argument("--twins-every", type=int, default=1, help="train a permuted-label twin of every k-th version")
    parser.add_argument("--drift-at", type=int, default=101)
    parser.add_argument("--drift-chunks", type=int, default=40, help="chunks after the drift (0: no drift stream)")
    parser.add_argument("--threads", type=int, default=1, help="torch threads")
    parser.add_argument(
        "--out", default=None, help="the figures file (default: benchmarks/results/promotion_guard*.json)"
    )
    args = parser.parse_args()
    # The figures are decisions, not timings: one thread, so that a machine shared with other jobs does not
    # leave every small op waiting at a barrier of two (15 ms for an MLP layer under a load of 10).
    torch.set_num_threads(args.threads)
    if args.timing:
        run_timing(args)
        return
    if args.imbalanced:
        args.chunks = args.chunks or 200
        run_imbalanced(args)
        return
    args.chunks = args.chunks or 500
    load_before = os.getloadavg()
    runs = []
    for seed in args.seeds:
        run = run_stream(seed, args.chunks, args.twins_every, None)
        runs.append(run)
        print(f"seed {seed} ({run['seconds']} s):")
        for name, row in run["settings"].items():
            print(
                f"  {name}: refused {row['refused']} of {row['versions']} versions, "
                f"{row['twins_refused']} of {row['twins']} permuted-label twins"
            )
    drift_runs = []
    for seed in args.seeds if args.drift_chunks else []:
        run = run_stream(seed, args.drift_at + args.drift_chunks - 1, args.twins_every, args.drift_at)
        drift_runs.append(run)
        print(f"labels permuted from chunk {args.drift_at} on, seed {seed} ({run['seconds']} s):")
        for name, row in run["settings"].items():
            print(
                f"  {name}: refused {row['refused_after_drift']} of the {row['after_drift']} versions from the "
                f"drift on (first promoted: {row['first_promoted_after_drift']})"
            )
    totals, drift_totals = summary(runs, drift=False), summary(drift_runs, drift=True)
    print("all seeds, stationary:")
    for name, total in totals.items():
        print(
            f"  {name}: refused {total['refused']} of {total['versions']} versions ({total['refused_share']:.2%}; "
            f"{total['refused_not_worse_on_test']} of them not worse on the test set), "
            f"{total['twins_refused']} of {total['twins']} permuted-label twins ({total['twins_refused_share']:.2%})"
        )
    print("all seeds, drift:")
    for name, total in drift_totals.items():
        print(f"  {name}: refused {total['refused_after_drift']} of {total['after_drift']} versions after the drift")
    guard = {
        "promotion_margin": DEFAULT.margin,
        "promotion_alpha": DEFAULT.alpha,
        "promotion_min_examples": DEFAULT.min_examples,
    }
    results = {
        "config": SERVICE_CONFIG,
        "default_guard": guard,
        "totals": totals,
        "drift_at": args.drift_at,
        "drift_totals": drift_totals,
        "runs": runs,
        "drift_runs": drift_runs,
    }
    write_figures(args.out or "benchmarks/results/promotion_guard.json", results, load_before)


if __name__ == "__main__":
    main()
