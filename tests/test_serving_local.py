"""The local publisher (pointer, guard, rollback), the background worker and the CLI, without servers.

The checkpoint helpers, shared with ``tests/test_serving_torchserve.py``, are in ``tests/helpers/serving.py``.
"""

from __future__ import annotations

import json
import logging
import shutil
import threading
import time
import zipfile
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from alma_daemon.cli import main
from alma_daemon.config import build_config
from alma_daemon.core.checkpoints import TRASH_PREFIX, WEIGHTS, CheckpointStore
from alma_daemon.core.chunk_buffer import MemoryBuffer
from alma_daemon.core.engine import Engine
from alma_daemon.data.datasets import MNIST_TASK
from alma_daemon.data.streams import Chunk, partition
from alma_daemon.data.tensors import LabeledData
from alma_daemon.learners import build_learner
from alma_daemon.service.bootstrap import drop_uncommitted_checkpoints
from alma_daemon.service.publish_handoff import PublishHandoff
from policies import build_policy
from serving.publishing import build_publisher
from serving.publishing.archiver import ARCHIVES, build_archive
from serving.publishing.background import BackgroundPublisher
from serving.publishing.live_pointer import LivePointer, ServingState
from serving.publishing.local import LocalPublisher
from serving.publishing.publisher import Candidate, Outcome, PublishError
from serving.publishing.retention import prune_after_commit, unneeded
from tests.helpers.data import separable_data
from tests.helpers.serving import metric_value, new_learner, save_version

MODEL = "alma"


@pytest.fixture
def store(tmp_path: Path) -> CheckpointStore:
    return CheckpointStore(tmp_path / "model_store", MODEL)


# -- the local publisher --------------------------------------------------------------------------
def test_first_version_is_promoted_and_the_pointer_names_it(store, good_and_bad):
    good, bad, sample = good_and_bad
    save_version(store, 1, bad, sample)
    outcome = LocalPublisher(store, promotion_margin=0.0).publish(1)
    assert (outcome.action, outcome.live_before) == ("promoted", None)
    pointer = json.loads((store.folder / "live.json").read_text())
    assert (pointer["live"], pointer["decided"]) == (1, 1)
    assert metric_value("alma_live_model_version") == 1
    assert [p.name for p in store.folder.iterdir() if p.name.startswith(".live-")] == []


def test_guard_refuses_a_worse_version_and_the_live_one_stays(store, good_and_bad):
    good, bad, sample = good_and_bad
    save_version(store, 1, good, sample)
    save_version(store, 2, bad, sample)
    publisher = LocalPublisher(store, promotion_margin=0.05)
    publisher.publish(1)
    refused_before = metric_value("alma_promotions_refused_total")
    outcome = publisher.publish(2)
    assert outcome.action == "refused"
    assert outcome.candidate_value > outcome.live_value + 0.05
    assert publisher.live_version() == 1
    assert publisher.pointer.read().decided == 2
    assert metric_value("alma_promotions_refused_total") == refused_before + 1


def test_guard_lets_a_worse_version_through_within_the_margin(store, good_and_bad):
    good, bad, sample = good_and_bad
    save_version(store, 1, good, sample)
    save_version(store, 2, bad, sample)
    publisher = LocalPublisher(store, promotion_margin=1.0)
    publisher.publish(1)
    assert publisher.publish(2).action == "promoted"
    assert publisher.live_version() == 2


def test_guard_evaluates_both_versions_on_the_candidates_sample_not_their_metrics(store, good_and_bad):
    good, bad, sample = good_and_bad
    other_sample = separable_data(MNIST_TASK, 50, seed=9)
    save_version(store, 1, good, sample)
    # metrics.json claims version 2 is perfect; the guard must not believe it.
    store.save(bad, 2, {"val_error": 0.0}, validation=other_sample)
    publisher = LocalPublisher(store, promotion_margin=0.0, promotion_min_examples=50)
    publisher.publish(1)
    outcome = publisher.publish(2)
    assert outcome.live_value == pytest.approx(good.evaluate(other_sample)["error"])
    assert outcome.candidate_value == pytest.approx(bad.evaluate(other_sample)["error"])
    assert (outcome.action, outcome.examples) == ("refused", 50)


def test_guard_tops_a_small_sample_up_from_the_samples_of_the_versions_before_it(store, good_and_bad):
    good, bad, sample = good_and_bad
    older, small, newer = sample.subset(slice(0, 100)), sample.subset(slice(100, 130)), sample.subset(slice(130, 200))
    save_version(store, 1, good, older)
    # With stream.replay a version's sample repeats the examples of earlier ones: each is taken once.
    save_version(store, 2, good, LabeledData.concat([older.subset(slice(0, 40)), small]))
    save_version(store, 3, bad, small)
    save_version(store, 4, good, newer)  # trained after the candidate: never read
    publisher = LocalPublisher(store, promotion_margin=0.0, promotion_min_examples=120)
    taken = publisher.guard_sample(publisher.load_candidate(3))
    expected = LabeledData.concat([small, older.subset(slice(0, 90))])
    assert torch.equal(taken.x, expected.x) and torch.equal(taken.y, expected.y)
    publisher.publish(1)
    outcome = publisher.publish(3)
    assert (outcome.action, outcome.examples) == ("refused", 120)
    assert outcome.candidate_value == pytest.approx(bad.evaluate(expected)["error"])


def test_versions_at_or_below_the_last_decided_one_are_skipped(store, good_and_bad):
    good, _, sample = good_and_bad
    for version in (1, 2):
        save_version(store, version, good, sample)
    publisher = LocalPublisher(store, promotion_margin=0.0)
    publisher.publish(2)
    assert publisher.publish(1).action == "skipped"
    assert publisher.publish(2).action == "skipped"
    assert publisher.live_version() == 2


def test_rollback_makes_an_earlier_version_live_without_the_guard(store, good_and_bad):
    good, bad, sample = good_and_bad
    save_version(store, 1, bad, sample)
    save_version(store, 2, good, sample)
    publisher = LocalPublisher(store, promotion_margin=0.0)
    publisher.publish(1)
    publisher.publish(2)
    assert publisher.rollback(1) == 2
    assert publisher.live_version() == 1
    # Training goes on: the next checkpoint is guarded against the rolled-back version.
    save_version(store, 3, good, sample)
    assert publisher.publish(3).live_before == 1
    with pytest.raises(ValueError, match="version 7 is not in"):
        publisher.rollback(7)


class LiveUnloadablePublisher(LocalPublisher):
    """A local publisher whose server can no longer load the live version, as a TorchServe that refuses it."""

    def ensure_serving(self, live: int) -> None:
        raise PublishError("register", f"version {live} fails to load")


def test_a_rollback_goes_ahead_when_the_live_version_cannot_be_served_again(store, good_and_bad):
    good, bad, sample = good_and_bad
    save_version(store, 1, good, sample)
    save_version(store, 2, bad, sample)
    LocalPublisher(store, promotion_margin=1.0).publish(1)
    LocalPublisher(store, promotion_margin=1.0).publish(2)
    publisher = LiveUnloadablePublisher(store, promotion_margin=1.0)
    assert publisher.rollback(1) == 2
    assert publisher.live_version() == 1
    with pytest.raises(PublishError, match="version 1 fails to load"):
        publisher.rollback(1)  # to the live version itself: serving it is the rollback


def test_a_live_version_missing_from_the_store_is_warned_about_once_not_at_every_resync(store, good_and_bad, caplog):
    good, _, sample = good_and_bad
    save_version(store, 1, good, sample)
    publisher = LocalPublisher(store, promotion_margin=0.0)
    publisher.publish(1)
    shutil.rmtree(store.path(1))
    with caplog.at_level(logging.WARNING, logger="serving.publishing.publisher"):
        for _ in range(3):
            publisher.resync()
    assert caplog.text.count("live version missing from the model store") == 1


def test_a_version_answering_nan_is_never_made_live(store, good_and_bad):
    good, bad, sample = good_and_bad
    save_version(store, 1, good, sample)
    broken = new_learner(seed=2)
    with torch.no_grad():
        for parameter in broken.model.parameters():
            parameter.fill_(float("nan"))
    save_version(store, 2, broken, sample)
    publisher = LocalPublisher(store, promotion_margin=1.0)
    publisher.publish(1)
    with pytest.raises(PublishError) as caught:
        publisher.publish(2)
    assert (caught.value.stage, caught.value.retry) == ("probe", False)
    assert publisher.live_version() == 1


def test_a_version_without_a_validation_sample_fails_for_good(store, good_and_bad):
    good, _, _ = good_and_bad
    store.save(good, 1, {"val_error": 0.1})
    with pytest.raises(PublishError) as caught:
        LocalPublisher(store, promotion_margin=0.0).publish(1)
    assert (caught.value.stage, caught.value.retry) == ("guard", False)


# -- the background worker ------------------------------------------------------------------------
class FlakyPublisher(LocalPublisher):
    """A local publisher whose staging fails the first ``failures`` times, like an unreachable server."""

    def __init__(self, store: CheckpointStore, failures: int, promotion_margin: float = 1.0):
        super().__init__(store, promotion_margin)
        self.failures = failures
        self.staged: list[int] = []

    def stage(self, candidate: Candidate) -> None:
        if self.failures > 0:
            self.failures -= 1
            raise PublishError("register", "server unreachable")
        self.staged.append(candidate.version)


def run_until_idle(worker: BackgroundPublisher) -> None:
    """Start the publisher's thread, wait until it has handled everything submitted, stop it."""
    worker.start()
    try:
        assert worker.wait_idle(timeout=60)
    finally:
        worker.close()


def test_background_publisher_publishes_only_the_newest_pending_version(store, good_and_bad):
    good, _, sample = good_and_bad
    for version in (1, 2, 3):
        save_version(store, version, good, sample)
    publisher = FlakyPublisher(store, failures=0)
    worker = BackgroundPublisher(publisher)
    for version in (1, 2, 3):
        worker.submit(version)
    run_until_idle(worker)
    assert publisher.staged == [3]
    assert publisher.live_version() == 3


def test_background_publisher_retries_failures_until_they_pass(store, good_and_bad):
    good, _, sample = good_and_bad
    save_version(store, 1, good, sample)
    publisher = FlakyPublisher(store, failures=2)
    failures_before = metric_value("alma_swap_failures_total", stage="register")
    swaps_before = metric_value("alma_swaps_total")
    durations_before = metric_value("alma_swap_duration_seconds_count")
    worker = BackgroundPublisher(publisher, retry_initial_seconds=0.01)
    worker.submit(1, written_at=time.monotonic())
    run_until_idle(worker)
    assert publisher.staged == [1]
    assert publisher.live_version() == 1
    assert metric_value("alma_swap_failures_total", stage="register") == failures_before + 2
    assert metric_value("alma_swaps_total") == swaps_before + 1
    assert metric_value("alma_swap_duration_seconds_count") == durations_before + 1


def test_a_failure_retried_until_it_passed_is_no_reason_to_warn_at_the_end_of_a_run(store, good_and_bad, caplog):
    """The run ends with a refused version (a decision, not a failure) after an earlier version failed
    once and was published on retry: the hand-off's drain must not report that failure."""
    good, bad, sample = good_and_bad
    save_version(store, 1, good, sample)
    publisher = FlakyPublisher(store, failures=1, promotion_margin=0.0)
    worker = BackgroundPublisher(publisher, retry_initial_seconds=0.01)
    handoff = PublishHandoff(worker)
    handoff.start()
    try:
        assert worker.wait_idle(timeout=60)
        save_version(store, 2, bad, sample)
        worker.submit(2)
        with caplog.at_level(logging.WARNING, logger="alma_daemon.service.publish_handoff"):
            handoff.drain()
    finally:
        handoff.close()
    assert publisher.staged == [1]
    assert worker.last_outcome is not None and worker.last_outcome.action == "refused"
    assert worker.last_error is None
    assert "the run ends before its last version is live" not in caplog.text


def test_the_engine_publishes_every_committed_checkpoint_through_the_hand_off(tmp_path):
    config = build_config(
        {
            "train": {"epochs": 2, "patience": 1, "batch_size": 64},
            "learner": {"width": 8},
            "daemon": {"checkpoint_dir": str(tmp_path / "model_store")},
            "serving": {"kind": "local", "promotion_margin": 1.0},
        }
    )
    worker = build_publisher(config)
    assert isinstance(worker, BackgroundPublisher) and isinstance(worker.publisher, LocalPublisher)
    handoff = PublishHandoff(worker)
    handoff.start()
    store = worker.publisher.store
    engine = Engine(
        build_learner("sm", MNIST_TASK, config.learner, 0),
        build_policy(config.policy),
        MemoryBuffer(),
        config,
        torch.device("cpu"),
        checkpoints=store,
        observers=[handoff.clock],
    )
    try:
        for i, part in enumerate(partition(separable_data(MNIST_TASK, 240, seed=1), 3, seed=0), start=1):
            engine.on_chunk(Chunk(i, part))
            handoff.committed()  # as the daemon does once the step is committed
        assert worker.wait_idle(timeout=60)
    finally:
        handoff.close()
    assert store.versions() == [1, 2, 3]
    assert worker.publisher.pointer.read().decided == 3
    assert worker.publisher.live_version() == 3


# -- a version deleted and written again (its step redone after Redis lost the commit) -----------
def test_an_archive_holds_the_checkpoint_now_under_its_version_not_a_deleted_one(store, good_and_bad):
    good, bad, sample = good_and_bad
    save_version(store, 1, good, sample)
    first = build_archive(store.path(1), MODEL, 1, store.folder / ARCHIVES)
    assert build_archive(store.path(1), MODEL, 1, store.folder / ARCHIVES) == first  # the same files: reused
    shutil.rmtree(store.path(1))
    save_version(store, 1, bad, sample)
    second = build_archive(store.path(1), MODEL, 1, store.folder / ARCHIVES)
    assert zipfile.ZipFile(second).read(WEIGHTS) == (store.path(1) / WEIGHTS).read_bytes()


def test_a_published_version_deleted_with_its_uncommitted_step_is_withdrawn_and_its_redo_published(store, good_and_bad):
    good, bad, sample = good_and_bad
    publisher = LocalPublisher(store, promotion_margin=1.0)
    save_version(store, 1, good, sample)
    save_version(store, 2, new_learner(seed=5), sample)
    publisher.publish(1)
    publisher.publish(2)
    archive = build_archive(store.path(2), MODEL, 2, store.folder / ARCHIVES)

    drop_uncommitted_checkpoints(store, 1)  # a restart finds Redis at version 1: it lost version 2's commit
    assert store.versions() == [1]
    state = publisher.pointer.read()
    assert (state.live, state.decided) == (1, 1)
    assert not archive.exists()

    save_version(store, 2, bad, sample)  # the redone step, with other weights
    outcome = publisher.publish(2)
    assert (outcome.action, outcome.live_before) == ("promoted", 1)
    assert publisher.live_version() == 2


def test_a_reload_forgets_a_handed_over_version_whose_checkpoint_was_deleted(store, good_and_bad):
    good, _, sample = good_and_bad
    save_version(store, 1, good, sample)
    publisher = FlakyPublisher(store, failures=0)
    worker = BackgroundPublisher(publisher, retry_initial_seconds=0.01)
    handoff = PublishHandoff(worker)
    worker.submit(2)  # handed over after its commit, which Redis then lost; the reload deletes it
    handoff.reloading()  # the daemon's order: before the reload deletes anything ...
    handoff.reloaded(1)  # ... and after it
    run_until_idle(worker)
    assert publisher.staged == [1]
    assert worker.last_error is None


def test_a_withdrawn_live_version_falls_back_to_the_newest_below_it_where_the_pointer_names_no_previous(
    store, good_and_bad
):
    """A live.json written before it had ``previous`` (or a version made live by a rollback from none)."""
    good, bad, sample = good_and_bad
    publisher = LocalPublisher(store, promotion_margin=0.0)
    save_version(store, 1, good, sample)
    save_version(store, 2, good, sample)
    publisher.publish(1)
    publisher.publish(2)
    written = json.loads(publisher.pointer.path.read_text())
    del written["previous"]
    publisher.pointer.path.write_text(json.dumps(written))

    drop_uncommitted_checkpoints(store, 1)
    state = publisher.pointer.read()
    assert (state.live, state.decided) == (1, 1)  # still serves, and the redone version is guarded against it
    save_version(store, 2, bad, sample)
    outcome = publisher.publish(2)
    assert (outcome.action, outcome.live_before) == ("refused", 1)
    assert publisher.live_version() == 1


def test_a_deletion_cut_short_by_a_crash_leaves_nothing_in_the_way_of_the_redone_version(
    store, good_and_bad, monkeypatch
):
    good, bad, sample = good_and_bad
    save_version(store, 1, good, sample)
    save_version(store, 2, good, sample)

    class Crash(BaseException):
        pass

    def crash_part_way(path: Path, *args: object, **kwargs: object) -> None:
        (Path(path) / WEIGHTS).unlink()
        raise Crash

    with monkeypatch.context() as patched, pytest.raises(Crash):
        patched.setattr(shutil, "rmtree", crash_part_way)
        drop_uncommitted_checkpoints(store, 1)

    # Renamed away whole before any file went: the number is free for the redone step at once.
    assert store.versions() == [1] and not store.path(2).exists()
    assert trash_in(store) != []
    drop_uncommitted_checkpoints(store, 1)  # the next start
    save_version(store, 2, bad, sample)  # the redone step
    BackgroundPublisher(LocalPublisher(store, promotion_margin=1.0)).start().close()  # the publisher's start
    assert trash_in(store) == []
    assert store.versions() == [1, 2]


class PausedPublisher(LocalPublisher):
    """A local publisher whose first publish stops before the serving lock until the test lets it go,
    then goes on, or fails as a lock held too long by another process makes it fail (retried)."""

    def __init__(self, store: CheckpointStore, fails: bool):
        super().__init__(store, promotion_margin=1.0)
        self.fails = fails
        self.entered, self.go = threading.Event(), threading.Event()

    def publish(self, version: int, wanted: Callable[[], bool] | None = None) -> Outcome:
        if not self.entered.is_set():
            self.entered.set()
            assert self.go.wait(60)
            if self.fails:
                raise TimeoutError(f"another process has held {self.pointer.lock_path} for 300 s")
        return super().publish(version, wanted)


@pytest.mark.parametrize("fails", [False, True], ids=["goes-on", "fails-retryably"])
@pytest.mark.parametrize("moment", ["after-the-withdrawal", "after-the-redone-checkpoint"])
def test_a_version_handed_over_before_a_reload_is_not_published_after_it_nor_its_redo_before_its_commit(
    store, good_and_bad, moment, fails
):
    """The worker has taken version 2 (handed over after its commit, which Redis then lost) and is
    about to publish it when the daemon reloads: the reload deletes version 2, and the redone step
    writes it again before its commit. The worker's publish goes on at ``moment`` of the reload."""
    good, bad, sample = good_and_bad
    save_version(store, 1, good, sample)
    LocalPublisher(store, promotion_margin=1.0).publish(1)
    save_version(store, 2, new_learner(seed=5), sample)
    publisher = PausedPublisher(store, fails)
    worker = BackgroundPublisher(publisher, retry_initial_seconds=0.01)
    handoff = PublishHandoff(worker)

    def resume() -> None:
        publisher.go.set()
        assert worker.wait_idle(timeout=60)

    # Errors outside the publishing steps, as the lock's timeout, count at the guard stage.
    failures_before = metric_value("alma_swap_failures_total", stage="guard")
    worker.submit(2)
    worker.start()
    try:
        assert publisher.entered.wait(60)
        handoff.reloading()  # the reload, in Daemon._reload_committed's order
        drop_uncommitted_checkpoints(store, 1)
        if moment == "after-the-withdrawal":
            resume()
        handoff.reloaded(1)
        save_version(store, 2, bad, sample)  # the redone step; its commit is still to come
        if moment == "after-the-redone-checkpoint":
            resume()
        assert worker.wait_idle(timeout=60)
        state = publisher.pointer.read()
        assert (state.live, state.decided) == (1, 1)
        # The paused publish failed where the case makes it fail, and nothing else failed.
        assert metric_value("alma_swap_failures_total", stage="guard") == failures_before + fails

        worker.submit(2)  # the redone step's commit hands it over
        assert worker.wait_idle(timeout=60)
        assert worker.last_outcome is not None
        assert (worker.last_outcome.action, worker.last_outcome.live_before) == ("promoted", 1)
        assert publisher.live_version() == 2
    finally:
        publisher.go.set()
        worker.close()


def test_build_publisher_is_none_when_serving_is_off():
    assert build_publisher(build_config({"serving": {"kind": "none"}})) is None


# -- how many versions stay on disk (daemon.keep_checkpoints) -------------------------------------
def trash_in(store: CheckpointStore) -> list[str]:
    """What deletions cut short left in the model store."""
    return [path.name for path in store.folder.iterdir() if path.name.startswith(TRASH_PREFIX)]


@pytest.mark.parametrize(
    ("live", "previous", "ruled_up_to", "deleted"),
    [
        (None, None, None, [1, 2, 3]),
        (1, None, 5, [2, 3]),  # the live version stays, however old
        (4, 2, 5, [1, 3]),  # and the one live before it, which serves again if the live one is withdrawn
        (None, None, 3, [1]),  # nothing above the versions ruled on is touched: 4 and 5 await the guard
    ],
)
def test_the_versions_deleted_are_the_ruled_ones_but_the_newest_the_live_and_the_previous(
    live, previous, ruled_up_to, deleted
):
    assert unneeded([1, 2, 3, 4, 5], 2, ServingState(live=live, previous=previous), ruled_up_to) == deleted


def test_each_decision_deletes_the_versions_beyond_the_newest_ruled_on_never_the_live_or_unruled_ones(
    store, good_and_bad
):
    good, bad, sample = good_and_bad
    save_version(store, 1, good, sample)
    for version in range(2, 9):
        save_version(store, version, bad, sample)
    archives = store.folder / ARCHIVES
    archives.mkdir()
    for version in (2, 5):
        (archives / f"{MODEL}-v{version}-0123456789abcdef.mar").write_bytes(b"an archive")
    publisher = LocalPublisher(store, promotion_margin=0.0, keep_checkpoints=2)
    assert publisher.publish(1).action == "promoted"
    assert store.versions() == list(range(1, 9))  # none ruled on beyond the newest two
    # The worker fell behind: 6 is decided, 7 and 8 are still to be ruled on.
    assert publisher.publish(6).action == "refused"
    assert store.versions() == [1, 5, 6, 7, 8]
    assert [path.name for path in archives.iterdir()] == [f"{MODEL}-v5-0123456789abcdef.mar"]
    assert publisher.publish(8).action == "refused"
    assert store.versions() == [1, 7, 8]

    save_version(store, 9, good, sample)
    assert publisher.publish(9).action == "promoted"
    assert store.versions() == [1, 8, 9]  # 1 was live before 9
    drop_uncommitted_checkpoints(store, 8)  # Redis lost 9's commit: 9 is withdrawn, 1 serves again
    assert publisher.live_version() == 1 and store.versions() == [1, 8]
    assert trash_in(store) == []


def test_without_a_publisher_the_main_thread_deletes_after_a_commit_and_never_waits_for_the_lock(store, good_and_bad):
    good, _, sample = good_and_bad
    for version in range(1, 6):
        save_version(store, version, good, sample)
    pointer = LivePointer(store.folder)
    pointer.write(ServingState(live=1, decided=1))  # left by a run with serving on
    with pointer.locked():  # held by `alma rollback` in another process
        assert prune_after_commit(store, keep=2) == []
    assert store.versions() == [1, 2, 3, 4, 5]
    assert prune_after_commit(store, keep=2) == [2, 3]  # the next commit
    assert store.versions() == [1, 4, 5]


def test_a_deletion_cut_short_by_a_crash_leaves_no_version_half_deleted_and_the_next_prune_ends_it(
    store, good_and_bad, monkeypatch, capsys
):
    good, _, sample = good_and_bad
    for version in range(1, 5):
        save_version(store, version, good, sample)

    class Crash(BaseException):
        pass

    def crash_part_way(path: Path, *args: object, **kwargs: object) -> None:
        (Path(path) / WEIGHTS).unlink()
        raise Crash

    with monkeypatch.context() as patched, pytest.raises(Crash):
        patched.setattr(shutil, "rmtree", crash_part_way)
        prune_after_commit(store, keep=2)

    assert store.versions() == [2, 3, 4] and len(trash_in(store)) == 1
    config = ["--set", f"daemon.checkpoint_dir={store.root}", "--set", "serving.kind=local"]
    assert main(["versions", *config, "--json"]) == 0
    assert [row["version"] for row in json.loads(capsys.readouterr().out)] == [2, 3, 4]
    assert prune_after_commit(store, keep=2) == [2]
    assert store.versions() == [3, 4] and trash_in(store) == []


def test_the_guard_tops_its_sample_up_from_the_versions_left_after_a_prune(store, good_and_bad):
    good, bad, sample = good_and_bad
    parts = [sample.subset(slice(40 * i, 40 * (i + 1))) for i in range(5)]
    for version, part in enumerate(parts[:4], start=1):
        save_version(store, version, good, part)
    save_version(store, 5, bad, parts[4])
    publisher = LocalPublisher(store, promotion_margin=0.0, promotion_min_examples=200, keep_checkpoints=2)
    publisher.publish(1)
    assert publisher.publish(4).action == "promoted"
    assert store.versions() == [1, 3, 4, 5]  # 2 deleted; 1 was live before 4

    taken = publisher.guard_sample(publisher.load_candidate(5))
    expected = LabeledData.concat([parts[4], parts[3], parts[2], parts[0]])
    assert torch.equal(taken.x, expected.x) and torch.equal(taken.y, expected.y)
    outcome = publisher.publish(5)
    assert (outcome.action, outcome.examples) == ("refused", 160)


def test_a_rollback_to_a_deleted_version_fails_in_one_line_naming_the_key(store, good_and_bad, capsys):
    good, _, sample = good_and_bad
    for version in range(1, 6):
        save_version(store, version, good, sample)
    LocalPublisher(store, promotion_margin=1.0, keep_checkpoints=2).publish(5)
    assert store.versions() == [4, 5]
    config = ["--set", f"daemon.checkpoint_dir={store.root}", "--set", "serving.kind=local"]

    assert main(["rollback", *config, "--set", "daemon.keep_checkpoints=2", "--to", "2"]) == 1
    error = capsys.readouterr().err
    assert error.startswith("alma rollback: error: version 2 was deleted from ") and error.count("\n") == 1
    assert "the newest daemon.keep_checkpoints (2) versions" in error
    assert main(["rollback", *config, "--to", "4"]) == 0
    assert LivePointer(store.folder).read().live == 4


# -- the commands ---------------------------------------------------------------------------------
def test_versions_and_rollback_commands(store, good_and_bad, capsys):
    good, bad, sample = good_and_bad
    save_version(store, 1, good, sample)
    save_version(store, 2, bad, sample)
    publisher = LocalPublisher(store, promotion_margin=1.0)
    publisher.publish(2)
    config = ["--set", f"daemon.checkpoint_dir={store.root}", "--set", "serving.kind=local"]

    assert main(["versions", *config, "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert [(r["version"], r["live"]) for r in rows] == [(1, False), (2, True)]
    assert rows[0]["validation_error"] == pytest.approx(good.evaluate(sample)["error"])

    assert main(["rollback", *config, "--to", "1"]) == 0
    assert "version 1 is live (was 2)" in capsys.readouterr().out
    assert publisher.live_version() == 1

    assert main(["rollback", *config, "--to", "5"]) == 1
    assert "version 5 is not in" in capsys.readouterr().err


def test_versions_shows_the_newest_and_the_live_one_and_says_how_many_it_left_out(store, good_and_bad, capsys):
    good, _, sample = good_and_bad
    for version in range(1, 26):
        save_version(store, version, good, sample)
    LocalPublisher(store, promotion_margin=1.0).publish(1)  # the first version is live; 24 came after it
    config = ["--set", f"daemon.checkpoint_dir={store.root}", "--set", "serving.kind=local"]

    def table(*extra: str) -> tuple[list[str], list[str]]:
        assert main(["versions", *config, *extra]) == 0
        lines = capsys.readouterr().out.splitlines()
        return [line.split()[0] for line in lines[1:] if line[:1].isdigit()], lines

    shown, lines = table()  # the newest 20 and the live one
    assert shown == ["1", *map(str, range(6, 26))]
    assert lines[-1] == "(4 older version(s) not shown: --last N shows the N newest, --last 0 all)"
    shown, lines = table("--last", "3")
    assert shown == ["1", "23", "24", "25"] and lines[-1].startswith("(21 older version(s) not shown")
    shown, lines = table("--last", "0")
    assert shown == list(map(str, range(1, 26))) and not lines[-1].startswith("(")

    assert main(["versions", *config, "--json"]) == 0  # for scripts: every version unless --last
    assert len(json.loads(capsys.readouterr().out)) == 25
    assert main(["versions", *config, "--json", "--last", "2"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert [(r["version"], r["live"]) for r in rows] == [(1, True), (24, False), (25, False)]


def test_a_json_body_is_read_as_json_even_with_leading_whitespace():
    """Pretty-printed JSON sent as bytes: it was taken for a safetensors body and refused."""
    from serving.protocols.codecs import codec_for

    instance = torch.zeros(MNIST_TASK.input_shape).tolist()
    body = ("\n  " + json.dumps({"instances": [instance]})).encode()
    assert codec_for(MNIST_TASK).examples_from_json(body).shape == (1, *MNIST_TASK.input_shape)


def test_versions_with_embedded_reads_the_store_of_the_daemon_run_with_embedded(
    tmp_path, monkeypatch, good_and_bad, capsys
):
    from alma_daemon.config import load_config
    from alma_daemon.service.embedded_redis import EMBEDDED_OVERRIDES

    good, _, sample = good_and_bad
    monkeypatch.chdir(tmp_path)
    (tmp_path / "svc.yaml").write_text("redis: {url: 'redis://127.0.0.1:6399/0'}\nserving: {kind: local}\n")
    embedded = load_config("svc.yaml", list(EMBEDDED_OVERRIDES))  # the folders `alma run --embedded` derives
    assert "svc-embedded" in str(embedded.daemon.checkpoint_dir)
    save_version(CheckpointStore(embedded.daemon.checkpoint_dir, embedded.serving.model_name), 1, good, sample)

    assert main(["versions", "--config", "svc.yaml", "--embedded", "--json"]) == 0
    assert [row["version"] for row in json.loads(capsys.readouterr().out)] == [1]
    assert main(["versions", "--config", "svc.yaml", "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == []
