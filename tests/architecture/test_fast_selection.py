"""`make test-fast` leaves out the engine modules: the list it reads names real modules, and the rule that
builds it from a recorded run takes a whole module when one of its tests is slow."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.conftest import REPO_ROOT, engine_modules
from tests.durations import engine_modules as measured_engine_modules
from tests.durations import read_record


def test_every_listed_engine_module_exists() -> None:
    listed = engine_modules()
    assert listed, "tests/engine_modules.txt is empty: make test-fast would start engines"
    missing = sorted(m for m in listed if not (REPO_ROOT / m).is_file())
    assert not missing, f"tests/engine_modules.txt names modules that are gone: {missing}"


def test_a_module_with_one_slow_test_is_listed_whole(tmp_path: Path) -> None:
    record = tmp_path / "durations.tsv"
    record.write_text("tests/a.py::test_x\tsetup\t9.00\ntests/a.py::test_x\tcall\t0.50\ntests/a.py::test_y\tcall\t0.10\n"
                      "tests/b.py::test_z\tcall\t2.90\ntests/b.py::test_w\tcall\t2.90\n")
    seconds = read_record(record)
    assert seconds["tests/a.py::test_x"] == 9.5
    (found,) = measured_engine_modules(seconds, 3.0)   # b's tests are each under 3 s: b stays in the fast set
    assert found == ("tests/a.py", 9.5, pytest.approx(9.6))
