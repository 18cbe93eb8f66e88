"""Convert: a merged Hugging Face checkpoint becomes an ONNX Runtime model folder at one precision.

Decoder LLMs of the families onnxruntime-genai's model builder supports go through the builder (KV cache,
fused attention, MatMulNBits int4/int8, genai_config.json). Anything else, or exporter="torch", goes
through `torch.onnx.export(dynamo=True)` and ONNX Runtime's own converters (release/stages/export_torch.py).

The output folder appears whole or not at all: everything is built in `<out>.partial` and renamed last.
The builder's noisy output goes to `<out>.convert.log` beside the folder (not inside it: the folder is
what gets packaged and hashed).
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass, field
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any, Literal

from pydantic import Field

from release.checkpoint import has_adapter, read_config, refuse_pickles, weight_files
from release.errors import InputError, StageFailed
from release.families import GENAI_ARCHITECTURES, builder_config, genai_config_problems
from release.faults import pause_point
from release.runtime import GenaiModel
from release.stages.base import Stage, StageInputs, StageResult, location, output_folder
from release.subprocs import start_child, stop_child
from release.tokenizer_parity import EDGE_STRINGS, compare_tokenizers

Precision = Literal["fp32", "fp16", "int8", "int4"]
Exporter = Literal["auto", "genai", "torch"]
PRECISIONS: tuple[str, ...] = ("fp32", "fp16", "int8", "int4")
EXECUTION_PROVIDERS: tuple[str, ...] = ("cpu", "cuda")

# The builder's own list of valid precision/provider pairs (it prints it and then builds anyway: an fp16
# CPU graph that fails at the second generation step, so relctl refuses it up front).
GENAI_COMBINATIONS = frozenset({
    ("fp32", "cpu"), ("fp32", "cuda"), ("fp16", "cuda"), ("int8", "cpu"), ("int8", "cuda"),
    ("int4", "cpu"), ("int4", "cuda"),
})
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json")


@dataclass(frozen=True)
class ConvertResult:
    """What convert produced and with which tools; `files` maps relative path -> bytes."""

    out_dir: Path
    precision: str
    exporter: str
    execution_provider: str
    versions: dict[str, str]
    files: dict[str, int]
    wall_time_s: float
    log_path: Path
    tokenizer_parity: bool | None = None
    notes: list[str] = field(default_factory=list)

    @property
    def total_bytes(self) -> int:
        return sum(self.files.values())

    def to_dict(self) -> dict[str, Any]:
        return {
            "out_dir": str(self.out_dir),
            "precision": self.precision,
            "exporter": self.exporter,
            "execution_provider": self.execution_provider,
            "versions": dict(self.versions),
            "files": dict(self.files),
            "total_bytes": self.total_bytes,
            "wall_time_s": round(self.wall_time_s, 3),
            "log_path": str(self.log_path),
            "tokenizer_parity": self.tokenizer_parity,
            "notes": list(self.notes),
        }


def convert(
    model_dir: Path,
    out_dir: Path,
    precision: Precision,
    exporter: Exporter = "auto",
    execution_provider: str = "cpu",
) -> ConvertResult:
    """Export the merged checkpoint `model_dir` to an ONNX Runtime folder `out_dir` at `precision`."""
    config = check_input(model_dir, precision, exporter, execution_provider)
    chosen = choose_exporter(config, precision, exporter, execution_provider)
    tmp = out_dir.with_name(out_dir.name + ".partial")
    log_path = out_dir.with_name(out_dir.name + ".convert.log")
    shutil.rmtree(tmp, ignore_errors=True)
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    parity: bool | None = None
    notes: list[str] = []
    try:
        if chosen == "genai":
            run_builder(model_dir, tmp, precision, execution_provider, log_path)
            notes += align_tokenizer(model_dir, tmp)
            parity = check_tokenizer_parity(model_dir, tmp)
        else:
            from release.stages.export_torch import export_torch  # noqa: PLC0415 - lazy: release is heavy

            export_torch(model_dir, tmp, precision, log_path)
            copy_tokenizer(model_dir, tmp)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    elapsed = time.perf_counter() - started
    shutil.rmtree(out_dir, ignore_errors=True)
    tmp.rename(out_dir)
    return ConvertResult(
        out_dir=out_dir,
        precision=precision,
        exporter="onnxruntime-genai" if chosen == "genai" else "torch.onnx",
        execution_provider=execution_provider,
        versions=tool_versions(chosen),
        files=list_files(out_dir),
        wall_time_s=elapsed,
        log_path=log_path,
        tokenizer_parity=parity,
        notes=notes,
    )


def check_input(model_dir: Path, precision: str, exporter: str, execution_provider: str) -> dict[str, Any]:
    """Refuse bad arguments and a bad checkpoint before any tool runs; return config.json."""
    if precision not in PRECISIONS:
        raise InputError(f"precision: '{precision}' is not supported", hint=f"use one of {', '.join(PRECISIONS)}")
    if exporter not in ("auto", "genai", "torch"):
        raise InputError(f"exporter: '{exporter}' is not supported", hint="use auto, genai or torch")
    if execution_provider not in EXECUTION_PROVIDERS:
        raise InputError(
            f"execution_provider: '{execution_provider}' is not supported",
            hint=f"use one of {', '.join(EXECUTION_PROVIDERS)}",
        )
    if not model_dir.is_dir():
        raise InputError(f"{model_dir}: no such checkpoint folder", hint="pass the merged checkpoint folder")
    config = read_config(model_dir)
    refuse_pickles(model_dir)
    weight_files(model_dir)
    if has_adapter(model_dir):
        raise InputError(
            f"{model_dir.name}: holds an unmerged adapter (adapter_config.json)",
            hint="merge the adapter first (merge stage); convert exports the merged weights only",
        )
    return config


def choose_exporter(config: dict[str, Any], precision: str, exporter: str, execution_provider: str) -> str:
    """'genai' or 'torch' for this architecture and request; InputError for combinations that cannot work."""
    architectures = config.get("architectures") or []
    arch = str(architectures[0]) if isinstance(architectures, list) and architectures else ""
    supported = arch in GENAI_ARCHITECTURES
    if exporter == "genai" and not supported:
        raise InputError(
            f"config.json: architecture '{arch or config.get('model_type')}' is not supported by "
            "onnxruntime-genai's model builder",
            hint="use exporter 'torch' (or 'auto'), or a supported family: llama, mistral, qwen2, phi3, gemma",
        )
    chosen = "genai" if exporter == "genai" or (exporter == "auto" and supported) else "torch"
    problems = genai_config_problems(config) if chosen == "genai" and supported else []
    if problems:
        raise InputError(
            f"config.json: onnxruntime-genai's model builder cannot build this {arch}: {'; '.join(problems)}",
            hint="change the config as the reason says, or set convert.exporter: torch",
        )
    if chosen == "genai" and (precision, execution_provider) not in GENAI_COMBINATIONS:
        raise InputError(
            f"convert: {precision} on execution provider '{execution_provider}' is not a combination "
            "onnxruntime-genai's builder supports",
            hint="fp16 is a GPU precision: set convert.execution_provider to cuda, or pick fp32/int8/int4 for cpu",
        )
    if chosen == "torch" and not arch:
        raise InputError(
            "config.json: no 'architectures' entry, so the model class to export is unknown",
            hint="save the config with model.save_pretrained(), which records architectures",
        )
    return chosen


def run_builder(model_dir: Path, out: Path, precision: str, execution_provider: str, log_path: Path) -> None:
    """Run the model builder in a subprocess (isolates its memory and its prints) into `out`."""
    cache = out.with_name(out.name + ".cache")
    shutil.rmtree(cache, ignore_errors=True)
    source = builder_input(model_dir, out.with_name(out.name + ".input"))
    cmd = [
        sys.executable, "-m", "onnxruntime_genai.models.builder",
        "-i", str(source), "-o", str(out), "-p", precision, "-e", execution_provider, "-c", str(cache),
    ]
    try:
        with log_path.open("w") as log:
            log.write("$ " + " ".join(cmd) + "\n")
            log.flush()
            # Its own process group, and it dies with relctl (even a SIGKILLed one): no orphan builder.
            proc = start_child(cmd, stdout=log, stderr=subprocess.STDOUT)
            try:
                pause_point("convert:builder-running")
                proc.wait()
            except BaseException:
                stop_child(proc, timeout_s=10)
                raise
    finally:
        shutil.rmtree(cache, ignore_errors=True)
        if source != model_dir:
            shutil.rmtree(source, ignore_errors=True)
    if proc.returncode != 0 or not (out / "model.onnx").is_file() or not (out / "genai_config.json").is_file():
        raise StageFailed(
            f"convert: onnxruntime-genai's model builder failed (exit {proc.returncode}): {last_line(log_path)}",
            hint=f"see the full builder log in {log_path}",
        )


def builder_input(model_dir: Path, shadow: Path) -> Path:
    """The folder the builder reads: `model_dir`, or `shadow` (links to its files) with config.json restated
    by release.families.builder_config when the builder would misread the original."""
    config = read_config(model_dir)
    restated = builder_config(config)
    if restated == config:
        return model_dir
    shutil.rmtree(shadow, ignore_errors=True)
    shadow.mkdir(parents=True)
    for path in model_dir.iterdir():
        if path.name != "config.json":
            (shadow / path.name).symlink_to(path.resolve())
    (shadow / "config.json").write_text(json.dumps(restated, indent=2) + "\n")
    return shadow


def align_tokenizer(model_dir: Path, out: Path) -> list[str]:
    """Make the served tokenizer files the training ones, with BOS/EOS settings stated explicitly.

    The training tokenizer.json is copied byte for byte (the post-processor that adds BOS lives there).
    tokenizer_config.json gets bos_token/eos_token and add_bos_token/add_eos_token derived from what
    tokenizers' post-processor really adds, because onnxruntime-extensions looks the BOS id up by the
    bos_token string in that file. Returns notes on what changed.
    """
    from tokenizers import Tokenizer  # noqa: PLC0415 - loaded only when a tokenizer is compared or aligned

    source = model_dir / "tokenizer.json"
    if not source.is_file():
        raise InputError(
            f"{model_dir.name}: tokenizer.json is missing",
            hint="save the fast tokenizer with the checkpoint (tokenizer.save_pretrained(dir))",
        )
    shutil.copy2(source, out / "tokenizer.json")
    training = Tokenizer.from_file(str(source))
    bos, eos = added_specials(training)
    cfg_path = out / "tokenizer_config.json"
    cfg: dict[str, Any] = json.loads(cfg_path.read_text()) if cfg_path.is_file() else {}
    wanted: dict[str, Any] = {"add_bos_token": bos is not None, "add_eos_token": eos is not None}
    if bos is not None:
        wanted["bos_token"] = bos
    if eos is not None:
        wanted["eos_token"] = eos
    wanted.setdefault("tokenizer_class", cfg.get("tokenizer_class") or "PreTrainedTokenizerFast")
    notes = [f"tokenizer_config.json: {k} {cfg.get(k)!r} -> {v!r}" for k, v in wanted.items() if cfg.get(k) != v]
    cfg.update(wanted)
    cfg_path.write_text(json.dumps(cfg, indent=2, ensure_ascii=False) + "\n")
    return notes


def added_specials(tokenizer: Any) -> tuple[str | None, str | None]:
    """The special tokens the post-processor puts before and after a text (BOS, EOS), if any."""
    sample = tokenizer.encode("a")
    mask = list(sample.special_tokens_mask)
    if 0 not in mask:
        return None, None
    first, last = mask.index(0), len(mask) - 1 - mask[::-1].index(0)
    bos = sample.tokens[0] if first > 0 else None
    eos = sample.tokens[-1] if last < len(mask) - 1 else None
    return bos, eos


def check_tokenizer_parity(model_dir: Path, out: Path) -> bool:
    """Whether the converted folder's served tokenizer encodes the probes exactly like the training one."""
    served = GenaiModel.load(out)
    return compare_tokenizers(served.encode, model_dir / "tokenizer.json", list(EDGE_STRINGS)).passed


def copy_tokenizer(model_dir: Path, out: Path) -> None:
    for name in (*TOKENIZER_FILES, "config.json", "generation_config.json"):
        if (model_dir / name).is_file():
            shutil.copy2(model_dir / name, out / name)


def list_files(root: Path) -> dict[str, int]:
    return {p.relative_to(root).as_posix(): p.stat().st_size for p in sorted(root.rglob("*")) if p.is_file()}


def tool_versions(exporter: str) -> dict[str, str]:
    names = ["onnxruntime-genai", "onnx", "onnxruntime"] if exporter == "genai" else [
        "torch", "onnx", "onnxscript", "onnxruntime", "transformers"]
    found: dict[str, str] = {}
    for name in names:
        try:
            found[name] = version(name)
        except PackageNotFoundError:
            found[name] = "not installed"
    return found


def last_line(path: Path) -> str:
    lines = [ln.strip() for ln in path.read_text(errors="replace").splitlines() if ln.strip()]
    return lines[-1][-300:] if lines else "(empty log)"


class ConvertInputs(StageInputs):
    upstream: str = Field(description="fingerprint of the stage that produced the checkpoint")
    precision: Precision
    exporter: Exporter = "auto"
    execution_provider: str = "cpu"
    checkpoint: Path = location()
    into: str = "model"


class ConvertOutputs(StageResult):
    model: str
    precision: str
    exporter: str
    execution_provider: str
    versions: dict[str, str]
    files: dict[str, int]
    tokenizer_parity: bool | None
    notes: list[str]


class ConvertStage(Stage[ConvertInputs, ConvertOutputs]):
    """Export the checkpoint to ONNX at a precision (the fp32 build of it is the `reference`)."""

    name = "convert"
    result_type = ConvertOutputs

    def __init__(self, inputs: ConvertInputs, label: str | None = None) -> None:
        super().__init__(inputs)
        self._label = label or self.name

    @property
    def label(self) -> str:
        return self._label

    def run(self, out: Path) -> ConvertOutputs:
        target = output_folder(out, self.inputs.into)
        result = convert(self.inputs.checkpoint, target, self.inputs.precision, exporter=self.inputs.exporter,
                         execution_provider=self.inputs.execution_provider)
        return ConvertOutputs(model=self.inputs.into, precision=result.precision, exporter=result.exporter,
                              execution_provider=result.execution_provider, versions=result.versions,
                              files=result.files, tokenizer_parity=result.tokenizer_parity, notes=result.notes)

    def summary(self, result: ConvertOutputs) -> str:
        if self.label == "reference":
            return "fp32 reference ONNX"
        return f"{result.precision} ONNX via {result.exporter}"
