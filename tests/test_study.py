"""``alma study``: the findings' rules on hand-made result sets, and a tiny study end to end."""

from __future__ import annotations

import dataclasses
import json

import pytest

from alma_daemon.cli import main
from alma_daemon.research import findings as F
from alma_daemon.research.findings import Finding, RunResult, judge
from alma_daemon.research.study import FULL, QUICK, paper_experiments, plan_runs, run_study

FINDING = {f.id: f for f in F.FINDINGS}


def wait_run(width: int, wait: int, cer: float, seed: int = 0, final: float = 0.1) -> RunResult:
    params = {"learner.name": "sm", "learner.width": width, "policy.wait": wait}
    return RunResult("mnist-wait", params, seed, {"cer": cer, "final_test_error": final}, [0.5] * 100)


def f1_runs(seed: int, small_best: int, large_best: int) -> list[RunResult]:
    """SM widths 4 and 64 at waits 1, 10, 100; each width's CER is lowest at the given wait."""
    return [
        wait_run(width, w, 10.0 if w == best else 20.0 + w / 100, seed)
        for width, best in ((4, small_best), (64, large_best))
        for w in (1, 10, 100)
    ]


def test_f1_holds_when_every_seed_has_small_models_best_at_an_intermediate_wait_and_large_ones_earlier():
    runs = f1_runs(0, small_best=10, large_best=1) + f1_runs(1, small_best=10, large_best=1)
    entry = judge(FINDING["F1"], runs)
    assert entry["verdict"] == "holds"
    assert entry["evidence"]["seeds_holding"] == "2 of 2"
    assert entry["evidence"]["per_seed"][0]["best_wait"] == {4: 10, 64: 1}


def test_f1_does_not_hold_when_the_small_model_is_best_greedy():
    runs = f1_runs(0, small_best=1, large_best=1) + f1_runs(1, small_best=100, large_best=10)
    assert judge(FINDING["F1"], runs)["verdict"] == "does not hold"


def test_f1_is_mixed_when_the_seeds_disagree():
    runs = f1_runs(0, small_best=10, large_best=1) + f1_runs(1, small_best=1, large_best=1)
    entry = judge(FINDING["F1"], runs)
    assert entry["verdict"] == "mixed"
    assert entry["evidence"]["seeds_holding"] == "1 of 2"
    assert entry["evidence"]["over_seeds"]["best_wait.4"] == {"mean": 5.5, "min": 1.0, "max": 10.0}


def test_f9_compares_the_geometric_wait_with_the_best_constant_wait_of_its_width():
    fixed = f1_runs(0, small_best=10, large_best=1)  # lowest constant-wait CER 10.0 at both widths
    better = RunResult(
        "mnist-geometric", {"learner.name": "sm", "learner.width": 4}, 0, {"cer": 9.0, "final_test_error": 0.1}
    )
    worse = dataclasses.replace(better, params={"learner.name": "sm", "learner.width": 64}, summary={"cer": 11.0})
    assert judge(FINDING["F9"], [*fixed, better])["verdict"] == "holds"
    entry = judge(FINDING["F9"], [*fixed, better, worse])
    assert entry["verdict"] == "does not hold"
    assert entry["evidence"]["per_seed"][0][64]["best_constant_wait"] == 1


def test_f3_on_a_stream_shorter_than_ten_chunks_reads_the_large_model_after_its_first_chunk_not_at_its_end():
    small = RunResult(
        "mnist-wait",
        {"learner.name": "sm", "learner.width": 4, "policy.wait": 10},
        0,
        {"cer": 3.0, "final_test_error": 0.2},
        [0.5] * 5,
    )
    large = dataclasses.replace(
        small, params={**small.params, "learner.width": 64}, test_error=[0.9, 0.9, 0.9, 0.9, 0.05]
    )
    entry = judge(FINDING["F3"], [small, large])
    assert entry["verdict"] == "does not hold"
    assert entry["evidence"]["per_seed"][0]["mnist"]["large_error_after_a_tenth"] == 0.9


def test_f8_is_not_judged_without_a_run_that_waits_for_the_whole_stream():
    """F8 compares greedy with one stage on all B chunks; a largest wait short of B is not i.i.d."""

    def run(width: int, wait: int) -> RunResult:
        summary = {"cer": 10.0, "final_test_error": 0.1 if wait == 1 else 0.05, "cumulative_train_flops": 1.0}
        return dataclasses.replace(wait_run(width, wait, cer=10.0), summary=summary)

    runs = [run(width, w) for width in (4, 64) for w in (1, 10)]
    entry = judge(FINDING["F8"], runs)
    assert entry["verdict"] == "not judged"
    assert "w = B" in entry["evidence"]["missing"]
    assert judge(FINDING["F8"], [*runs, run(4, 100), run(64, 100)])["verdict"] == "holds"


def cifar_run(wait: int, cer: float, early: float, final: float) -> RunResult:
    """SM width 4 on a CIFAR-10 stream of 100 chunks: ``early`` for the first ten, then ``final``."""
    params = {"learner.name": "sm", "learner.width": 4, "policy.wait": wait}
    return RunResult("cifar-wait", params, 0, {"cer": cer, "final_test_error": final}, [early] * 10 + [final] * 90)


def test_f2_holds_only_with_a_tardy_run_that_waits_for_the_whole_stream():
    greedy, middle = cifar_run(1, 80.0, early=0.8, final=0.75), cifar_run(10, 77.0, early=0.9, final=0.72)
    assert judge(FINDING["F2"], [greedy, middle, cifar_run(100, 90.0, early=0.9, final=0.70)])["verdict"] == "holds"
    entry = judge(FINDING["F2"], [greedy, middle, cifar_run(50, 90.0, early=0.9, final=0.70)])
    assert entry["verdict"] == "not judged" and "w = B" in entry["evidence"]["missing"]


def method_run(learner: str, width: int, cer: float, flops: float, memory: float, inference: float = 1.0):
    summary = {
        "cer": cer,
        "final_test_error": 0.1,
        "cumulative_train_flops": flops,
        "cumulative_parameters": memory,
        "final_inference_flops_per_example": inference,
    }
    return RunResult("mnist-methods", {"learner.name": learner, "learner.width": width}, 0, summary)


def test_f4_needs_a_cheaper_sm_with_a_lower_cer_for_every_growing_run():
    sm = method_run("sm", 4, cer=10.0, flops=1.0, memory=1.0)
    ens = method_run("ens", 4, cer=8.0, flops=5.0, memory=5.0, inference=5.0)
    gens = method_run("gens", 4, cer=9.0, flops=1.0, memory=20.0, inference=50.0)
    costly_grower = method_run("gmoe", 4, cer=12.0, flops=2.0, memory=2.0)
    assert judge(FINDING["F4"], [sm, ens, gens, costly_grower])["verdict"] == "holds"
    cheap_grower = method_run("firefly", 4, cer=12.0, flops=0.5, memory=2.0)  # no SM within its compute
    entry = judge(FINDING["F4"], [sm, ens, gens, costly_grower, cheap_grower])
    assert entry["verdict"] == "does not hold"
    assert entry["evidence"]["per_seed"][0]["won"] == 4


def test_a_rule_that_fails_is_an_error_not_a_finding_left_unjudged():
    def broken(runs):
        return runs[0].summary["no such key"], {}

    with pytest.raises(KeyError, match="no such key"):
        judge(Finding("FX", "claim", "rule", broken), f1_runs(0, 10, 1))


def test_a_finding_whose_runs_are_missing_is_not_judged():
    entry = judge(FINDING["F2"], f1_runs(0, 10, 1))
    assert entry["verdict"] == "not judged"
    assert "cifar-wait" in entry["evidence"]["missing"]


#: A test-only scale: every experiment of the paper study on streams of 20 tiny chunks.
TINY = dataclasses.replace(
    QUICK,
    name="tiny",
    mnist_megabatches=20,
    mnist_examples=400,
    mnist_waits=[1, 10, 20],
    mnist_epochs=1,
    mnist_wait_widths=[4, 8],
    mnist_method_widths=[4, 8],
    mnist_sm_sizes=[16],
    mnist_replay_wait=10,
    cifar_megabatches=20,
    cifar_examples=200,
    cifar_waits=[1, 10, 20],
    cifar_epochs=1,
    cifar_width=4,
    cifar_large_width=8,
    test_examples=100,
)


def test_the_quick_and_full_scales_plan_every_experiment_with_one_folder_per_run(tmp_path):
    for scale, seeds in ((QUICK, 1), (FULL, 3)):
        runs = plan_runs(paper_experiments(scale), seeds, tmp_path)
        assert {r.experiment for r in runs} == {e.name for e in paper_experiments(scale)}
        assert len({r.folder for r in runs}) == len(runs)
        assert {r.seed for r in runs} == set(range(seeds))


@pytest.mark.slow
def test_a_tiny_study_runs_judges_reports_and_resumes(tmp_path, capsys):
    said: list[str] = []
    findings = run_study(tmp_path, TINY, say=said.append)
    assert [f["id"] for f in findings] == [f"F{i}" for i in range(1, 10)]
    assert all(f["verdict"] in ("holds", "does not hold", "mixed") for f in findings), findings
    written = json.loads((tmp_path / "findings.json").read_text())
    assert written["findings"] == json.loads(json.dumps(findings))
    assert written["failed_runs"] == {} and written["seeds_judged"] == [0]
    assert said[-1].startswith(f"[{written['runs']}/{written['of']}]") and written["runs"] == written["of"]
    page = (tmp_path / "report.html").read_text()
    assert page.count("data:image/png;base64,") >= 3 * 6 and "http" not in page.replace("http-equiv", "")
    assert (tmp_path / "figures" / "mnist-replay-replay.png").is_file()
    assert "| F1 |" in (tmp_path / "report.md").read_text()

    # started again on the same folder, it runs nothing and judges alike
    said.clear()
    again = run_study(tmp_path, TINY, say=said.append)
    assert said == [f"study tiny: {written['runs']} runs (1 seed(s)); {written['runs']} already finished in {tmp_path}"]
    assert [f["verdict"] for f in again] == [f["verdict"] for f in findings]

    # A second seed with one run that cannot finish (a file stands where its folder goes): that seed
    # is left out of every verdict, which stay seed 0's alone.
    blocked = next(r for r in plan_runs(paper_experiments(TINY), 2, tmp_path) if r.seed == 1)
    blocked.folder.parent.mkdir(parents=True, exist_ok=True)
    blocked.folder.write_text("not a folder")
    said.clear()
    two = run_study(tmp_path, TINY, seeds=2, say=said.append)
    summary = json.loads((tmp_path / "findings.json").read_text())
    assert summary["seeds_judged"] == [0] and list(summary["failed_runs"]) == [blocked.label]
    assert said[-1].startswith("judged on seed(s) [0] only")
    assert "Verdicts judged on seed(s) [0] only" in (tmp_path / "report.md").read_text()
    assert [(f["id"], f["verdict"]) for f in two] == [(f["id"], f["verdict"]) for f in findings]


def test_a_study_with_no_complete_seed_says_so(tmp_path):
    from alma_daemon.research.study_report import write_study_report

    write_study_report(tmp_path, [], [], QUICK, seeds=1, judged=[])
    assert "Verdicts judged on no seed: the other seeds have runs missing." in (tmp_path / "report.md").read_text()


def test_alma_study_list_names_every_finding(capsys):
    assert main(["study", "--list"]) == 0
    out = capsys.readouterr().out
    assert all(f"F{i} " in out for i in range(1, 10)) and "cifar-wait" in out


def test_alma_study_without_out_is_a_usage_error_with_a_reason(capsys):
    assert main(["study", "paper"]) == 2  # as argparse's usage errors
    assert capsys.readouterr().err == (
        "alma study: error: give a study and --out (e.g. alma study paper --out runs/study), or --list\n"
    )


@pytest.mark.parametrize("seeds", ["0", "-1"])
def test_alma_study_rejects_fewer_than_one_seed(tmp_path, capsys, seeds):
    assert main(["study", "paper", "--out", str(tmp_path), "--seeds", seeds]) == 2
    assert capsys.readouterr().err == f"alma study: error: --seeds must be >= 1; got {seeds}\n"


@dataclasses.dataclass
class FakeRun:
    """What the report's figures read from a run: its config, summary and series."""

    config: dict
    summary: dict
    series: list = dataclasses.field(default_factory=list)


def fake_run(learner: str, width: int, wait: int, seed: int, cer: float, replay: bool = False) -> FakeRun:
    config = {
        "learner": {"name": learner, "width": width},
        "policy": {"wait": wait},
        "stream": {"replay": replay, "seed": seed},
        "seed": seed,
    }
    return FakeRun(config, {"cer": cer, "cumulative_train_flops": 1e9 * width * (5 if replay else 1)})


def test_cer_lines_join_the_waits_of_each_method_and_size_at_the_mean_over_seeds():
    from alma_daemon.observability.figures import cer_lines

    runs = [
        fake_run("sm", width, wait, seed, cer=wait + seed) for width in (8, 16) for wait in (10, 1) for seed in (0, 1)
    ]
    lines = cer_lines(runs, "cumulative_train_flops", "cer")
    assert list(lines) == ["sm width=8", "sm width=16"]
    assert [(p[1], p[2]) for p in lines["sm width=8"]] == [(1.5, {"policy.wait": 1}), (10.5, {"policy.wait": 10})]


def test_a_legend_leaves_out_keys_a_configuration_does_not_have():
    from alma_daemon.observability.figures import describe

    assert describe({"learner.name": "sm", "learner.members": None, "policy.wait": 1}) == "sm wait=1"
    assert describe({"learner.name": "ens", "learner.members": 5, "policy.wait": 1}) == "ens members=5 wait=1"


def test_runs_whose_list_valued_keys_differ_are_grouped_by_them():
    from alma_daemon.observability.figures import configurations

    runs = [fake_run("sm", 8, 10, seed, cer=1.0) for seed in (0, 1)]
    runs[1].config["dataset"] = {"files": ["other.txt"]}
    assert len(configurations(runs)) == 2  # lists are not hashable as they come from the config


def test_replay_pairs_go_from_the_run_without_replay_to_the_same_run_with_it():
    from alma_daemon.observability.figures import replay_pairs

    runs = [
        fake_run(m, 8, 10, 0, cer=c, replay=r) for m, c, r in (("sm", 20, False), ("sm", 15, True), ("ens", 9, False))
    ]
    assert replay_pairs(runs, "cumulative_train_flops", "cer") == [("sm", (8e9, 20), (4e10, 15))]
