"""Lineage: what a serving version was made from, so a regression can be traced to code, data and weights."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from release.core.hashing import sha256_file
from release.registry import tags as T
from release.registry.records import RunRecord

GIT_COMMIT_TAG = T.TRAINING_GIT_COMMIT


def training_lineage(run: RunRecord) -> dict[str, Any]:
    """The training run's identity, commit and data digests as MLflow recorded them."""
    tags = run.tags
    datasets = [dict(d) for d in run.datasets]
    data_hashes = {k.removeprefix("data.").removesuffix(".sha256"): v for k, v in tags.items()
                   if k.startswith("data.") and k.endswith(".sha256")}
    return {
        "run_id": run.run_id,
        "experiment_id": run.experiment_id,
        "run_name": run.run_name,
        "git_commit": tags.get(GIT_COMMIT_TAG),
        "git_dirty": tags.get(T.TRAINING_GIT_DIRTY),
        "datasets": datasets,
        "data_sha256": data_hashes,
        "params": dict(run.params),
    }


def checkpoint_lineage(checkpoint: Path, weight_files: list[Path]) -> dict[str, Any]:
    """sha256 of config.json and of every weight and adapter file, as fetched."""
    adapter = [checkpoint / n for n in ("adapter_config.json", "adapter_model.safetensors")
               if (checkpoint / n).is_file()]
    return {
        "config_sha256": sha256_file(checkpoint / "config.json"),
        "weights_sha256": {p.name: sha256_file(p) for p in weight_files},
        "adapter_sha256": {p.name: sha256_file(p) for p in adapter},
    }


def repo_state(path: Path) -> dict[str, Any]:
    """Commit and dirty state of the git repository holding `path` (release.yaml or the project)."""
    # GitPython costs ~0.15 s to import: paid here, by a release, never by `check` or a refused promote.
    import git  # noqa: PLC0415

    try:
        repo = git.Repo(path, search_parent_directories=True)
        commit = repo.head.commit.hexsha if repo.head.is_valid() else None
        return {
            "path": str(repo.working_tree_dir),
            "commit": commit,
            "dirty": repo.is_dirty(untracked_files=False),
        }
    except (git.InvalidGitRepositoryError, git.NoSuchPathError):
        return {"path": None, "commit": None, "dirty": None}

