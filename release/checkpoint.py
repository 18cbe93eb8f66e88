"""Reading a Hugging Face checkpoint folder without loading it.

Everything here reads safetensors headers and JSON only. Nothing is unpickled and no weights are
materialized, so a broken or hostile checkpoint is refused before any loader can misread it
(e.g. transformers inventing a default 7B config when config.json is missing).
"""

from __future__ import annotations

import json
import struct
from dataclasses import dataclass
from math import prod
from pathlib import Path

from release.errors import InputError
from release.jsonfile import read_json_file

# Bytes per element for every dtype the safetensors format defines.
DTYPE_SIZES: dict[str, int] = {
    "BOOL": 1, "U8": 1, "I8": 1, "F8_E4M3": 1, "F8_E5M2": 1,
    "I16": 2, "U16": 2, "F16": 2, "BF16": 2,
    "I32": 4, "U32": 4, "F32": 4,
    "I64": 8, "U64": 8, "F64": 8,
}
PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".pkl", ".pickle", ".ckpt")
MAX_HEADER_BYTES = 100 * 1024 * 1024


@dataclass(frozen=True)
class TensorInfo:
    name: str
    dtype: str
    shape: tuple[int, ...]
    # Absolute byte range inside the file (header included), so a reader can seek straight to it.
    start: int
    end: int

    @property
    def nbytes(self) -> int:
        return self.end - self.start


@dataclass(frozen=True)
class SafetensorsHeader:
    path: Path
    tensors: dict[str, TensorInfo]
    metadata: dict[str, str]


def read_header(path: Path) -> SafetensorsHeader:
    """Parse and check one .safetensors header; raise InputError naming the file on any defect."""
    try:
        size = path.stat().st_size
        with path.open("rb") as fh:
            raw_len = fh.read(8)
            if len(raw_len) < 8:
                raise _bad(path, "file is shorter than the 8-byte header length")
            (header_len,) = struct.unpack("<Q", raw_len)
            if header_len > MAX_HEADER_BYTES or 8 + header_len > size:
                raise _bad(path, f"header length {header_len} exceeds the file size {size} (truncated?)")
            header = json.loads(fh.read(header_len))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise _bad(path, f"unreadable header ({exc.__class__.__name__})") from exc
    if not isinstance(header, dict):
        raise _bad(path, "header is not a JSON object")
    metadata = header.pop("__metadata__", None) or {}
    data_start = 8 + header_len
    tensors: dict[str, TensorInfo] = {}
    for name, spec in header.items():
        tensors[name] = _tensor_info(path, name, spec, data_start, size)
    return SafetensorsHeader(path=path, tensors=tensors, metadata=dict(metadata))


def _tensor_info(path: Path, name: str, spec: object, data_start: int, size: int) -> TensorInfo:
    if not isinstance(spec, dict) or not {"dtype", "shape", "data_offsets"} <= spec.keys():
        raise _bad(path, f"tensor '{name}' has a malformed header entry")
    dtype = spec["dtype"]
    if dtype not in DTYPE_SIZES:
        raise _bad(path, f"tensor '{name}' has unknown dtype {dtype!r}")
    shape = tuple(int(d) for d in spec["shape"])
    begin, end = (int(x) for x in spec["data_offsets"])
    expected = prod(shape) * DTYPE_SIZES[dtype]
    if end - begin != expected:
        raise _bad(path, f"tensor '{name}' spans {end - begin} bytes, its {dtype}{list(shape)} needs {expected}")
    if data_start + end > size:
        raise _bad(
            path,
            f"tensor '{name}' ends at byte {data_start + end} but the file has {size} bytes (truncated?)",
        )
    return TensorInfo(name=name, dtype=dtype, shape=shape, start=data_start + begin, end=data_start + end)


def _bad(path: Path, why: str) -> InputError:
    return InputError(
        f"{path.name}: {why}",
        hint="re-export the checkpoint with safetensors (save_pretrained(..., safe_serialization=True))",
    )


def refuse_pickles(folder: Path) -> None:
    """Pickle checkpoints can run code when loaded; relctl never opens them."""
    found = sorted(p.name for p in folder.rglob("*") if p.is_file() and p.suffix in PICKLE_SUFFIXES)
    if found:
        raise InputError(
            f"{folder.name}: pickle checkpoint files are not accepted ({', '.join(found[:3])})",
            hint="save the model with safetensors (save_pretrained(..., safe_serialization=True)); "
            "relctl never unpickles weights",
        )


def read_config(folder: Path) -> dict[str, object]:
    """config.json of a checkpoint folder; its absence is an input error, never a default."""
    path = folder / "config.json"
    missing = InputError(
        f"{folder.name}: config.json is missing",
        hint="log the model's config.json next to its weights (model.config.save_pretrained(dir))",
    )
    data = read_json_file(path, missing, fix_hint="fix or re-save config.json")
    if not isinstance(data, dict) or "model_type" not in data:
        raise InputError(f"{path.name}: no model_type", hint="save the config with transformers' save_pretrained")
    return data


def weight_files(folder: Path) -> list[Path]:
    """The base model's safetensors files, in index order when the checkpoint is sharded."""
    index_path = folder / "model.safetensors.index.json"
    if index_path.is_file():
        try:
            weight_map: dict[str, str] = json.loads(index_path.read_text())["weight_map"]
        except (json.JSONDecodeError, KeyError, TypeError) as exc:
            raise InputError(f"{index_path.name}: no readable weight_map",
                             hint="re-save the sharded checkpoint") from exc
        names = sorted(set(weight_map.values()))
        missing = [n for n in names if not (folder / n).is_file()]
        if missing:
            raise InputError(
                f"{index_path.name}: lists shard {missing[0]} which is not in the checkpoint",
                hint="upload every shard named in the index",
            )
        return [folder / n for n in names]
    files = sorted(p for p in folder.glob("*.safetensors") if p.name != "adapter_model.safetensors")
    if not files:
        raise InputError(
            f"{folder.name}: no *.safetensors weights found",
            hint="log the checkpoint in Hugging Face layout: config.json + model.safetensors",
        )
    return files


def check_index(folder: Path, headers: dict[Path, SafetensorsHeader]) -> None:
    """Every tensor the index names lives in the shard it names, and no shard holds unlisted tensors."""
    index_path = folder / "model.safetensors.index.json"
    if not index_path.is_file():
        return
    weight_map: dict[str, str] = json.loads(index_path.read_text())["weight_map"]
    by_file = {p.name: h for p, h in headers.items()}
    for tensor, shard in weight_map.items():
        if tensor not in by_file[shard].tensors:
            raise InputError(
                f"{index_path.name}: tensor '{tensor}' is mapped to {shard}, which does not contain it",
                hint="re-save the sharded checkpoint; the index and shards disagree",
            )
    listed = set(weight_map)
    for name, header in by_file.items():
        extra = set(header.tensors) - listed
        if extra:
            raise InputError(
                f"{index_path.name}: {name} holds tensor '{min(extra)}' that the index does not list",
                hint="re-save the sharded checkpoint; the index and shards disagree",
            )


def has_adapter(folder: Path) -> bool:
    return (folder / "adapter_config.json").is_file()
