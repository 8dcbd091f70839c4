"""Run by tests/test_distributed.py under torchrun: one learner's stages on every rank, each rank's result saved.

``python -m torch.distributed.run ... -m tests.ranks_worker LEARNER TASK OUT`` trains stage 1, then
grows and trains stages 2 and 3 (the learner contract's tiny data and trainer), and rank r writes
``OUT/rank<r>.pt``: its weights, its architecture, its reports' FLOPs and the sizes of the training
batches its model saw.
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch

from alma_daemon.config import learner_config
from alma_daemon.learners import build_learner
from alma_daemon.testing.learner_checks import fit_stage
from alma_daemon.training.distributed import join_process_group, leave_process_group
from tests.helpers.contract import TASKS, contract_keys


def main(name: str, task_name: str, out: str) -> None:
    world = join_process_group(torch.device("cpu"))
    case = TASKS[task_name]
    learner = build_learner(name, case.task, learner_config(contract_keys(name, {}), name=name), 0)
    train, val = case.split()
    rows: set[int] = set()
    learner.model.register_forward_pre_hook(lambda module, args: rows.add(len(args[0])) if module.training else None)
    flops = [fit_stage(learner, train, val, stage, case.optimizer).flops for stage in (1, 2, 3)]
    saved = {"state": learner.state_dict(), "arch": learner.arch, "flops": flops, "batch_rows": sorted(rows)}
    torch.save(saved, Path(out) / f"rank{world.rank}.pt")
    leave_process_group()


if __name__ == "__main__":
    main(*sys.argv[1:])
