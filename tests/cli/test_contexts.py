"""Every context release.yaml sets is checked against the model's maximum by `relctl check` and by promote's
first step, in seconds, each refusal naming the setting to change (issue 27: gates.memory.context 512 on a
model whose maximum is 128 passed check and failed 72 s into a vLLM promote, hinting at another command's
flag)."""

from __future__ import annotations

import json
from pathlib import Path

import yaml
from click.testing import CliRunner
from mlflow import MlflowClient

from release.cli import cli
from release.registry import Registry
from release.registry.store import connect, ensure_experiment, resolve_store

LLAMA = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 64, "intermediate_size": 128,
         "num_attention_heads": 4, "num_key_value_heads": 2, "num_hidden_layers": 2, "vocab_size": 256,
         "max_position_embeddings": 128, "rms_norm_eps": 1e-5, "torch_dtype": "float32"}


def logged_run(project: Path) -> str:
    """A run with the run contract's files (headers are all check reads): config.json says 128 positions."""
    store = resolve_store(project)
    connect(store)
    client = MlflowClient(tracking_uri=store.tracking_uri)
    run = client.create_run(ensure_experiment(store, "tiny-llm"), tags={"mlflow.source.git.commit": "0" * 40,
                                                                         "data.eval.sha256": "0" * 64})
    checkpoint = project / "checkpoint"
    checkpoint.mkdir()
    (checkpoint / "config.json").write_text(json.dumps(LLAMA))
    (checkpoint / "model.safetensors").write_bytes(b"\0" * 64)
    (checkpoint / "tokenizer.json").write_text("{}")
    client.log_artifacts(run.info.run_id, str(checkpoint), "checkpoint")
    prompts = project / "prompts.jsonl"
    prompts.write_text('{"prompt": "reverse a b ->"}\n')
    client.log_artifact(run.info.run_id, str(prompts), "validation")
    client.set_terminated(run.info.run_id)
    return run.info.run_id


def release_yaml(project: Path, config: dict[str, object]) -> None:
    (project / "release.yaml").write_text(yaml.safe_dump({"model": "tiny-llm", **config}))


def errors_and_hints(stderr: str) -> list[tuple[str, str]]:
    lines = [line for line in stderr.splitlines() if line.startswith(("error: ", "hint: "))]
    return [(e.removeprefix("error: "), h.removeprefix("hint: ")) for e, h in zip(lines[::2], lines[1::2], strict=True)]


def test_every_context_beyond_the_models_maximum_is_refused_naming_its_setting(tmp_path: Path) -> None:
    run = logged_run(tmp_path)
    release_yaml(tmp_path, {
        "serving": {"context_tokens": 1024},
        "validation": {"max_new_tokens": 16},                       # within: not named
        "gates": {"memory": {"memory_gib": 2, "concurrency": 4, "context": 512, "cold_start": False},
                  "load": {"traffic": {"rate": 4, "requests": 4, "output_tokens": 200}}},
    })
    result = CliRunner().invoke(cli, ["--project-dir", str(tmp_path), "check", run])
    assert result.exit_code == 2, result.output + result.stderr
    found = {e.split(":", 2)[1].strip(): (e, h) for e, h in errors_and_hints(result.stderr)
             if "maximum context" in e}
    assert set(found) == {"serving.context_tokens", "gates.memory.context", "gates.load.traffic.output_tokens"}
    error, hint = found["gates.memory.context"]
    assert error == ("release.yaml: gates.memory.context: 512 tokens is beyond the model's maximum context "
                     "(max_position_embeddings 128 in config.json)")
    assert hint == "set gates.memory.context to 128 or less"
    assert found["gates.load.traffic.output_tokens"][1].startswith("set gates.load.traffic.output_tokens to below 128")
    assert all("--" not in h for _, h in found.values())  # a setting, never another command's flag


def test_a_gates_default_context_is_in_effect_and_checked(tmp_path: Path) -> None:
    run = logged_run(tmp_path)
    release_yaml(tmp_path, {"gates": {"memory": {"memory_gib": 2, "cold_start": False}}})  # context: default 512
    result = CliRunner().invoke(cli, ["--project-dir", str(tmp_path), "check", run])
    assert result.exit_code == 2
    assert ("release.yaml: gates.memory.context: 512 tokens is beyond the model's maximum context "
            "(max_position_embeddings 128 in config.json)", "set gates.memory.context to 128 or less") \
        in errors_and_hints(result.stderr)


def test_contexts_within_the_maximum_pass_and_unset_planning_defaults_are_left_alone(tmp_path: Path) -> None:
    run = logged_run(tmp_path)
    release_yaml(tmp_path, {"gates": {"memory": {"memory_gib": 2, "context": 128, "cold_start": False}}})
    result = CliRunner().invoke(cli, ["--project-dir", str(tmp_path), "check", run])
    assert "maximum context" not in result.stderr, result.stderr  # serving.context_tokens' default 512 is not set


def test_promote_refuses_before_any_stage_and_registers_nothing(tmp_path: Path) -> None:
    run = logged_run(tmp_path)
    release_yaml(tmp_path, {"gates": {"memory": {"memory_gib": 2, "context": 512, "cold_start": False}}})
    result = CliRunner().invoke(cli, ["--project-dir", str(tmp_path), "promote", run])
    assert result.exit_code == 2, result.output + result.stderr
    assert "gates.memory.context: 512 tokens is beyond" in result.stderr
    assert not (tmp_path / ".relctl" / "work" / run).exists()  # no stage started
    assert Registry(resolve_store(tmp_path)).list_models() == []
