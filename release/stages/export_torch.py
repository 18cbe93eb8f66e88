"""The torch exporter: `torch.onnx.export(dynamo=True)` of the logits graph, then ONNX Runtime's converters.

Used for architectures onnxruntime-genai's builder does not cover (or exporter="torch"). The graph takes
input_ids and attention_mask (int64, dynamic batch and sequence) and returns logits; there is no KV cache
and no genai_config.json, so these folders are served by a plain InferenceSession, not GenaiModel.
Weights always go to external data (model.onnx.data), as the builder does, so models over 2 GB export.
"""

from __future__ import annotations

import contextlib
import inspect
import io
import logging
import shutil
import warnings
from pathlib import Path
from typing import Any

from release.errors import InputError, StageFailed

MODEL_FILE = "model.onnx"
DATA_FILE = "model.onnx.data"
# MatMulNBits quantizes K in blocks; 32 divides the hidden sizes of every real model and of the tests'.
INT4_BLOCK_SIZE = 32


def export_torch(model_dir: Path, out: Path, precision: str, log_path: Path) -> None:
    """Export `model_dir` to `out/model.onnx` (+ .data) at `precision`; tool output goes to `log_path`."""
    out.mkdir(parents=True, exist_ok=True)
    fp32_dir = out.with_name(out.name + ".fp32")
    shutil.rmtree(fp32_dir, ignore_errors=True)
    fp32_dir.mkdir()
    try:
        with log_path.open("w") as log, capture_output(log):
            log.write(f"torch.onnx.export(dynamo=True) of {model_dir}, precision {precision}\n")
            export_fp32(model_dir, fp32_dir / MODEL_FILE)
            if precision == "fp32":
                move_model(fp32_dir, out)
            elif precision == "fp16":
                to_fp16(fp32_dir / MODEL_FILE, out / MODEL_FILE)
            elif precision == "int8":
                to_int8(fp32_dir / MODEL_FILE, out / MODEL_FILE)
            else:
                to_int4(fp32_dir / MODEL_FILE, out / MODEL_FILE)
    except (InputError, StageFailed):
        raise
    except Exception as exc:
        raise StageFailed(
            f"convert: torch export failed ({exc.__class__.__name__}: {str(exc).splitlines()[0][:200]})",
            hint=f"see {log_path}; if the architecture is a supported decoder, try exporter 'genai'",
        ) from exc
    finally:
        shutil.rmtree(fp32_dir, ignore_errors=True)


@contextlib.contextmanager
def capture_output(log: io.TextIOBase) -> Any:
    """Send the exporter's prints, warnings and logging to the log file instead of the terminal."""
    handler = logging.StreamHandler(log)
    root = logging.getLogger()
    # torch.onnx logs through its own stderr handler (e.g. "torchvision is not installed"); quiet it here.
    torch_onnx = logging.getLogger("torch.onnx")
    previous_level = torch_onnx.level
    root.addHandler(handler)
    torch_onnx.setLevel(logging.ERROR)
    try:
        with warnings.catch_warnings(), contextlib.redirect_stdout(log), contextlib.redirect_stderr(log):
            warnings.simplefilter("ignore")
            yield
    finally:
        root.removeHandler(handler)
        torch_onnx.setLevel(previous_level)


def load_torch_model(model_dir: Path) -> Any:
    """The model class named in config.json's architectures, loaded from safetensors only."""
    import transformers

    config = transformers.AutoConfig.from_pretrained(str(model_dir))
    arch = (config.architectures or [""])[0]
    model_class = getattr(transformers, arch, None)
    if model_class is None:
        raise InputError(
            f"config.json: architecture '{arch}' is not a transformers model class",
            hint="save the config with transformers' save_pretrained so architectures names a real class",
        )
    model = model_class.from_pretrained(str(model_dir), config=config, use_safetensors=True)
    return model.eval()


class LogitsOnly:
    """Wraps a transformers model so the exported graph is (input_ids, attention_mask) -> logits."""

    @staticmethod
    def wrap(model: Any) -> Any:
        import torch

        class _Wrapper(torch.nn.Module):
            def __init__(self, inner: Any) -> None:
                super().__init__()
                self.inner = inner

            def forward(self, input_ids: Any, attention_mask: Any) -> Any:
                # use_cache=False where the model has a cache: the graph carries no KV state, only logits.
                kwargs = {"use_cache": False} if "use_cache" in inspect.signature(self.inner.forward).parameters else {}
                return self.inner(input_ids=input_ids, attention_mask=attention_mask, **kwargs).logits

        return _Wrapper(model).eval()


def export_fp32(model_dir: Path, path: Path) -> None:
    import torch

    model = load_torch_model(model_dir)
    vocab = int(getattr(model.config, "vocab_size", 2) or 2)
    ids = torch.randint(0, vocab, (2, 8), generator=torch.Generator().manual_seed(0))
    mask = torch.ones_like(ids)
    batch, seq = torch.export.Dim("batch"), torch.export.Dim("sequence")
    program = torch.onnx.export(
        LogitsOnly.wrap(model),
        (ids, mask),
        dynamo=True,
        input_names=["input_ids", "attention_mask"],
        output_names=["logits"],
        dynamic_shapes={"input_ids": {0: batch, 1: seq}, "attention_mask": {0: batch, 1: seq}},
        verbose=False,
    )
    if program is None:
        raise StageFailed("convert: torch.onnx.export returned no program", hint="update torch and onnxscript")
    program.save(str(path), external_data=True)
    fix_data_location(path)


def fix_data_location(path: Path) -> None:
    """Re-save so the weights live in exactly one `model.onnx.data` beside the graph."""
    import onnx

    model = onnx.load(str(path))
    for stale in path.parent.glob("*.data"):
        stale.unlink()
    save_onnx(model, path)


def save_onnx(model: Any, path: Path) -> None:
    import onnx

    onnx.save_model(
        model, str(path), save_as_external_data=True, all_tensors_to_one_file=True, location=DATA_FILE,
    )


def move_model(src_dir: Path, out: Path) -> None:
    for name in (MODEL_FILE, DATA_FILE):
        shutil.move(str(src_dir / name), str(out / name))


def to_fp16(src: Path, dst: Path) -> None:
    import onnx
    from onnxruntime.transformers.float16 import convert_float_to_float16

    # keep_io_types: callers feed and read float32 exactly as with the fp32 graph.
    model = convert_float_to_float16(onnx.load(str(src)), keep_io_types=True)
    save_onnx(model, dst)


def to_int8(src: Path, dst: Path) -> None:
    from onnxruntime.quantization import QuantType, quantize_dynamic

    quantize_dynamic(
        str(src), str(dst), weight_type=QuantType.QInt8, op_types_to_quantize=["MatMul", "Gemm"],
        use_external_data_format=True,
    )
    fix_data_location(dst)


def to_int4(src: Path, dst: Path) -> None:
    import onnx
    from onnxruntime.quantization.matmul_nbits_quantizer import MatMulNBitsQuantizer

    quantizer = MatMulNBitsQuantizer(onnx.load(str(src)), block_size=INT4_BLOCK_SIZE, is_symmetric=True)
    quantizer.process()
    if not any(n.op_type == "MatMulNBits" for n in quantizer.model.model.graph.node):
        raise InputError(
            f"convert: no MatMul weight could be quantized to int4 (block size {INT4_BLOCK_SIZE})",
            hint="int4 needs MatMul weights whose input size is a multiple of 32; use int8 for this model",
        )
    save_onnx(quantizer.model.model, dst)
