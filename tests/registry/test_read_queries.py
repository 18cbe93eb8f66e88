"""The read commands ask the registry only what their answer needs: `history` one query for the model and one
search of its versions (the engine and precision it names beside each version), `status` one for the model
plus its versions' own records, and the repair/reap sweep only when a move is pending.

The MlflowClient is the real one on a real SQLite store; each public call is counted on the way through.
"""

from __future__ import annotations

import functools
import json
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from mlflow.tracking import MlflowClient

from release.cli import cli
from release.registry import Registry
from release.registry import tags as T
from release.registry.aliases import AliasMove, read_history
from release.registry.store import resolve_store
from tests.registry.test_aliases import MODEL, _register

WRITES = ("set_registered_model_tag", "update_registered_model", "create_registered_model",
          "delete_registered_model", "set_tag", "set_terminated")


@pytest.fixture
def calls(monkeypatch: pytest.MonkeyPatch) -> Counter[str]:
    """Every public MlflowClient method call from here on, by name (the calls themselves run unchanged)."""
    counted: Counter[str] = Counter()

    def counting(name: str, method: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(method)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            counted[name] += 1
            return method(*args, **kwargs)

        return wrapper

    for name, method in vars(MlflowClient).items():
        if not name.startswith("_") and callable(method):
            monkeypatch.setattr(MlflowClient, name, counting(name, method))
    return counted


def relctl(project: Path, *args: str) -> str:
    result = CliRunner().invoke(cli, ["--project-dir", str(project), *args])
    assert result.exit_code == 0, result.output
    return result.output


def test_history_is_one_query_and_status_reads_only_the_versions(project_dir: Path, tmp_path: Path,
                                                                  calls: Counter[str]) -> None:
    _register(project_dir, tmp_path, 1)
    _register(project_dir, tmp_path, 2)
    calls.clear()
    moves = json.loads(relctl(project_dir, "history", MODEL, "--json"))
    assert [m["action"] for m in moves] == ["promote", "promote"]
    assert calls == {"get_registered_model": 1, "search_model_versions": 1}

    calls.clear()
    data = json.loads(relctl(project_dir, "status", MODEL, "--json"))
    assert {a: info["version"] for a, info in data["aliases"].items()} == {"production": "2", "previous": "1"}
    # The model once (aliases, history and the servers recorded on it), then per alias its version and its
    # release run, which also holds its numbers here, and one search for adapters built for the model: no runs
    # search, no lock, no experiment lookup, nothing written.
    assert calls == {"get_registered_model": 1, "get_model_version": 2, "get_run": 2, "search_model_versions": 1}


def test_a_pending_move_is_found_by_the_same_query_and_repaired(project_dir: Path, tmp_path: Path,
                                                                calls: Counter[str]) -> None:
    _register(project_dir, tmp_path, 1)
    registry = Registry(resolve_store(project_dir))
    # What a process killed between moving the alias and confirming the move leaves behind.
    pending = AliasMove(at="2030-01-01T00:00:00.000+00:00", action="promote", changes={"production": [None, "1"]},
                        reason="killed", state="pending", key=f"{T.HISTORY_PREFIX}20300101T000000.000Z.abcdef")
    registry.client.set_registered_model_tag(MODEL, pending.key, pending.to_json())
    calls.clear()
    relctl(project_dir, "status", MODEL)
    assert calls["search_runs"] == 1  # the dead-run reap ran because a move was pending
    assert calls["set_registered_model_tag"] >= 1
    assert [m.state for m in read_history(registry.client, MODEL, include_abandoned=True)] == ["done", "done"]
    calls.clear()
    relctl(project_dir, "history", MODEL)
    # repaired: the next read is the model's one query again (and the search naming each version's engine)
    assert calls == {"get_registered_model": 1, "search_model_versions": 1}
    assert not set(calls) & set(WRITES)
