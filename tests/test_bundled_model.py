"""A team's model module bundled beside each checkpoint (serving/runtimes/bundled_model.py), as a server that
builds every version in one process registers it."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from serving.runtimes.bundled_model import BUNDLED_SOURCE, register_bundled_module

MODULE = "alma_test_team_network"


def version_folder(root: Path, version: int, source: str) -> Path:
    folder = root / str(version)
    folder.mkdir()
    (folder / "spec.json").write_text(json.dumps({"config": {"model": f"{MODULE}:build"}}))
    (folder / BUNDLED_SOURCE).write_text(source)
    return folder


def test_a_version_with_other_source_registers_it_again_and_one_with_the_same_keeps_the_module(tmp_path):
    first = version_folder(tmp_path, 1, "WIDTH = 8\n")
    changed = version_folder(tmp_path, 2, "WIDTH = 16\n")
    same = version_folder(tmp_path, 3, "WIDTH = 16\n")
    try:
        register_bundled_module(first, first / "spec.json")
        built_first = sys.modules[MODULE]
        assert built_first.WIDTH == 8

        register_bundled_module(changed, changed / "spec.json")
        assert sys.modules[MODULE].WIDTH == 16
        assert built_first.WIDTH == 8  # what was built from the first keeps its module

        held = sys.modules[MODULE]
        register_bundled_module(same, same / "spec.json")
        assert sys.modules[MODULE] is held
    finally:
        sys.modules.pop(MODULE, None)


def test_the_source_of_a_deleted_version_is_replaced_by_the_next(tmp_path):
    first = version_folder(tmp_path, 1, "WIDTH = 8\n")
    register_bundled_module(first, first / "spec.json")
    try:
        (first / BUNDLED_SOURCE).unlink()
        second = version_folder(tmp_path, 2, "WIDTH = 8\n")
        register_bundled_module(second, second / "spec.json")
        assert Path(sys.modules[MODULE].__file__) == second / BUNDLED_SOURCE
    finally:
        sys.modules.pop(MODULE, None)
