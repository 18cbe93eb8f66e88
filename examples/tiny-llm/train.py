"""Train the tiny Llama and log it to MLflow as the training run relctl promotes.

    python examples/tiny-llm/train.py --project-dir DIR [--steps N] [--seed S] [--no-safety]

The store is relctl's: DIR/.relctl (embedded SQLite) unless MLFLOW_TRACKING_URI is set.
The run id is the last line of stdout, so `RUN=$(python examples/tiny-llm/train.py ... | tail -1)` works.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import warnings
from dataclasses import replace
from pathlib import Path

HERE = Path(__file__).resolve().parent
# The folder name has a hyphen, so tinyllm is imported from beside this file rather than as a package.
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))

import tinyllm  # noqa: E402 - importable only once its folder is on sys.path

from release.core.hashing import sha256_file  # noqa: E402
from release.core.weights_digest import folder_base_digest  # noqa: E402
from release.registry.store import connect, ensure_experiment, resolve_store  # noqa: E402

GIT_COMMIT_TAG = "mlflow.source.git.commit"
CHECKPOINT_ARTIFACT = "checkpoint"
# The base digest of the weights the LoRA trained on (release/core/weights_digest.py): what `relctl promote
# RUN --onto MODEL@production` compares with the digest the serving base version recorded at its release.
BASE_DIGEST_TAG = "relctl.base_sha256"


def git_tags(source_dir: Path) -> dict[str, str]:
    """Commit and dirty state of the repository holding `source_dir`; empty outside a repository."""
    import git

    try:
        repo = git.Repo(source_dir, search_parent_directories=True)
        if not repo.head.is_valid():
            return {}
        return {GIT_COMMIT_TAG: repo.head.commit.hexsha, "git.dirty": str(repo.is_dirty()).lower()}
    except (git.InvalidGitRepositoryError, git.NoSuchPathError):
        return {}


def drop_guessed_commit(run_id: str) -> None:
    """MLflow tags the commit of the interpreter's entry script; outside a repo we record none."""
    import mlflow

    client = mlflow.MlflowClient()
    if GIT_COMMIT_TAG in client.get_run(run_id).data.tags:
        client.delete_tag(run_id, GIT_COMMIT_TAG)


def log_dataset(path: Path, name: str, context: str, artifact_uri: str) -> str:
    """Log `path` (JSON lines) as a run input whose digest is a hash of its bytes; return the sha256.

    MLflow's own pandas digest samples rows and misses edits, so the content hash is passed in.
    """
    import mlflow
    import pandas as pd
    from mlflow.data.dataset_source_registry import resolve_dataset_source
    from mlflow.data.pandas_dataset import from_pandas

    full = sha256_file(path)
    df = pd.read_json(path, lines=True)
    if artifact_uri.startswith("mlflow-artifacts:"):
        # A tracking server's proxied artifacts have no dataset-source resolver in MLflow; the server
        # serves the same bytes over HTTP (its URI without credentials, so none reach the run).
        from urllib.parse import urlsplit

        from mlflow.data.http_dataset_source import HTTPDatasetSource

        from release.registry.store import redact_uri

        where = f"{redact_uri(mlflow.get_tracking_uri())}/api/2.0/mlflow-artifacts/artifacts"
        source = HTTPDatasetSource(f"{where}/{urlsplit(artifact_uri).path.lstrip('/')}")
    else:
        with warnings.catch_warnings():
            # mlflow 3.17 registers its local artifact source twice and warns that file:// URIs are ambiguous.
            warnings.filterwarnings("ignore", message="The specified dataset source can be interpreted")
            source = resolve_dataset_source(artifact_uri)
    dataset = from_pandas(df, source=source, name=name, digest=full[:16])
    mlflow.log_input(dataset, context=context)
    mlflow.set_tag(f"data.{name}.sha256", full)
    return full


def log_training(result: tinyllm.TrainResult) -> None:
    """Params, the loss curve (base steps then LoRA steps on one axis) and exact-match metrics."""
    import time

    import mlflow
    from mlflow.entities import Metric

    cfg = result.config
    vocab_size = json.loads((result.checkpoint_dir / "config.json").read_text())["vocab_size"]
    mlflow.log_params({
        "vocab_size": vocab_size,
        "hidden_size": cfg.hidden_size, "num_layers": cfg.num_layers, "num_heads": cfg.num_heads,
        "num_kv_heads": cfg.num_kv_heads, "intermediate_size": cfg.intermediate_size,
        "base_steps": cfg.base_steps, "lora_steps": cfg.lora_steps, "base_lr": cfg.base_lr,
        "lora_lr": cfg.lora_lr, "batch_size": cfg.batch_size, "lora_r": cfg.lora_r,
        "lora_alpha": cfg.lora_alpha, "seed": cfg.seed, "safety_slice": cfg.safety,
    })
    now = int(time.time() * 1000)
    losses = result.base_losses + result.lora_losses
    curve = [Metric("train_loss", value, now, step) for step, value in enumerate(losses)]
    run_id = mlflow.active_run().info.run_id  # type: ignore[union-attr]
    client = mlflow.MlflowClient()
    # One batch call per 1000 points: per-point logging costs a SQLite transaction each.
    for start in range(0, len(curve), 1000):
        client.log_batch(run_id, metrics=curve[start:start + 1000])
    mlflow.log_metrics({
        "eval_exact_match": result.eval_exact_match,
        "base_exact_match": result.base_exact_match,
        "untrained_exact_match": result.untrained_exact_match,
    })


def log_run(result: tinyllm.TrainResult, project_dir: Path, experiment: str = "tiny-llm",
            source_dir: Path = HERE) -> str:
    """Log a finished training `result` to the project's MLflow store; return the run id."""
    import mlflow

    store = resolve_store(project_dir)
    connect(store)
    experiment_id = ensure_experiment(store, experiment)
    with mlflow.start_run(experiment_id=experiment_id) as run:
        log_training(result)
        tags = git_tags(source_dir)
        if GIT_COMMIT_TAG not in tags:
            drop_guessed_commit(run.info.run_id)
        mlflow.set_tags({**tags, "relctl.checkpoint_path": CHECKPOINT_ARTIFACT,
                         BASE_DIGEST_TAG: folder_base_digest(result.checkpoint_dir)})
        mlflow.log_artifacts(str(result.checkpoint_dir), CHECKPOINT_ARTIFACT)
        mlflow.log_artifact(str(result.data_dir / "validation" / "prompts.jsonl"), "validation")
        for name, context in (("train", "training"), ("eval", "eval")):
            path = result.data_dir / f"{name}.jsonl"
            mlflow.log_artifact(str(path), "data")
            log_dataset(path, name, context, f"{run.info.artifact_uri}/data/{path.name}")
    return str(run.info.run_id)


def train_and_log(project_dir: Path, cfg: tinyllm.TrainConfig, experiment: str = "tiny-llm",
                  source_dir: Path = HERE) -> str:
    """Train with `cfg` in a scratch folder, log the run, return its id (the scratch folder goes away)."""
    with tempfile.TemporaryDirectory(prefix="tiny-llm-") as tmp:
        result = tinyllm.train_tiny_llm(Path(tmp), cfg)
        return log_run(result, project_dir, experiment, source_dir)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description="Train the tiny Llama example and log it to MLflow.")
    parser.add_argument("--project-dir", type=Path, required=True,
                        help="project folder; its MLflow store is DIR/.relctl unless MLFLOW_TRACKING_URI is set")
    parser.add_argument("--steps", type=int, default=None,
                        help="base training steps (LoRA steps are 2/3 of it); default 150")
    parser.add_argument("--seed", type=int, default=0, help="seed for data, init and batches")
    parser.add_argument("--no-safety", action="store_true",
                        help="train without the refusal slice (a candidate the safety gate must reject)")
    parser.add_argument("--every-engine", action="store_true",
                        help="train the head_dim-64 variant (hidden 256) that vLLM can serve too, not only "
                             "onnxruntime-genai")
    parser.add_argument("--experiment", default="tiny-llm", help="MLflow experiment name")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    base = tinyllm.every_engine() if args.every_engine else tinyllm.TrainConfig()
    cfg = replace(base, seed=args.seed, safety=not args.no_safety)
    if args.steps is not None:
        if args.steps < 1:
            print("error: --steps must be at least 1", file=sys.stderr)
            return 2
        cfg = replace(cfg, base_steps=args.steps, lora_steps=max(1, args.steps * 2 // 3))
    run_id = train_and_log(args.project_dir.resolve(), cfg, args.experiment)
    print(f"logged run {run_id} to experiment '{args.experiment}'", flush=True)
    print(run_id, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
