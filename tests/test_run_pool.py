"""The run pool of ``alma study`` and the benchmarks (research/run_pool.py): what resumes and what runs again."""

from __future__ import annotations

import json

import pytest

from alma_daemon.research.run_pool import PoolRun, RecordFile, RunFolders, resume, run_each


def record(name: str) -> dict:
    return {"name": name}


def crash(name: str) -> dict:
    raise RuntimeError(f"{name} crashed")


def invoke(cache: RecordFile, runs: list[PoolRun], jobs: int) -> tuple[list[str], dict[str, str]]:
    """One benchmark invocation: the keys run to the end, and those that failed with their error."""
    done: list[str] = []
    failed: dict[str, str] = {}
    _, todo = resume(runs, cache)
    run_each(
        todo,
        cache,
        jobs=jobs,
        on_done=lambda run, result: done.append(run.key),
        on_failed=lambda run, exc: failed.setdefault(run.key, str(exc)),
    )
    return done, failed


@pytest.mark.parametrize("jobs", [1, 2], ids=["in process", "worker processes"])
def test_a_cached_run_is_not_run_again_and_a_crashed_one_runs_again_on_the_next_invocation(tmp_path, jobs):
    path = tmp_path / "runs.json"
    path.write_text(json.dumps({"runs": {"cached": record("from an earlier invocation")}}))
    runs = [
        PoolRun("cached", crash, ("cached",)),  # would fail if it ran
        PoolRun("crashes", crash, ("crashes",)),
        PoolRun("new", record, ("new",)),
    ]
    done, failed = invoke(RecordFile(path), runs, jobs)
    assert done == ["new"] and failed == {"crashes": "crashes crashed"}
    # The file is rewritten after each finished run, keys sorted, and a failed run is left out.
    assert json.loads(path.read_text()) == {
        "runs": {"cached": record("from an earlier invocation"), "new": record("new")}
    }
    assert list(json.loads(path.read_text())["runs"]) == ["cached", "new"]

    fixed = [*runs[:1], PoolRun("crashes", record, ("crashes",)), *runs[2:]]
    done, failed = invoke(RecordFile(path), fixed, jobs)
    assert done == ["crashes"] and failed == {}
    assert json.loads(path.read_text())["runs"]["crashes"] == record("crashes")


def test_in_process_runs_go_in_their_order_and_one_failure_does_not_stop_the_others(tmp_path):
    runs = [PoolRun("a", record, ("a",)), PoolRun("b", crash, ("b",)), PoolRun("c", record, ("c",))]
    said: list[str] = []
    run_each(
        runs,
        RecordFile(tmp_path / "runs.json"),
        jobs=1,
        on_done=lambda run, result: said.append(f"done {run.key}"),
        on_failed=lambda run, exc: said.append(f"failed {run.key}: {exc}"),
    )
    assert said == ["done a", "failed b: b crashed", "done c"]


def test_a_study_run_is_finished_only_when_its_folder_holds_the_whole_stream_of_its_planned_config(tmp_path):
    config = {"stream": {"megabatches": 3}, "seed": 0}

    def folder(name: str, text: str | None) -> tuple:
        path = tmp_path / name
        if text is not None:
            path.mkdir()
            (path / "results.json").write_text(text)
        return path, config

    def results(chunks: int, run_config: dict = config) -> str:
        return json.dumps({"config": run_config, "summary": {"chunks": chunks}, "series": []})

    folders = RunFolders(
        {
            "never started": folder("never started", None),
            "unreadable": folder("unreadable", '{"config": '),
            "stopped mid-stream": folder("stopped mid-stream", results(2)),
            "another scale": folder("another scale", results(3, {**config, "seed": 1})),
            "finished": folder("finished", results(3)),
        }
    )
    runs = [PoolRun(key, crash, (key,)) for key in [*folders.planned, "never started"]]  # a key twice runs once
    finished, todo = resume(runs, folders)
    assert list(finished) == ["finished"] and finished["finished"]["summary"] == {"chunks": 3}
    assert [run.key for run in todo] == ["never started", "unreadable", "stopped mid-stream", "another scale"]
