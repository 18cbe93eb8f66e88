"""Reading a Hugging Face checkpoint folder without loading it.

Everything here reads safetensors headers and JSON only. Nothing is unpickled and no weights are
materialized, so a broken or hostile checkpoint is refused before any loader can misread it
(e.g. transformers inventing a default 7B config when config.json is missing).
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from math import prod
from pathlib import Path

from release.core.errors import InputError
from release.core.jsonfile import read_json_file

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
            raw_header = fh.read(header_len)
    except OSError as exc:
        raise _bad(path, f"unreadable header ({exc.__class__.__name__})") from exc
    from release.core.jsonfile import parse_json  # noqa: PLC0415

    try:   # the one loader's parse: bounded depth, a tensor named twice refused
        header = parse_json(raw_header, path.name, hint="re-save the checkpoint with save_pretrained(dir)")
    except InputError as exc:
        raise _bad(path, f"unreadable header ({exc.message.removeprefix(path.name + ': ')})") from exc
    if not isinstance(header, dict):
        raise _bad(path, "header is not a JSON object")
    metadata = header.pop("__metadata__", None) or {}
    if not isinstance(metadata, dict) or not all(isinstance(v, str) for v in metadata.values()):
        raise _bad(path, "__metadata__ is not a mapping of strings")
    data_start = 8 + header_len
    tensors: dict[str, TensorInfo] = {}
    for name, spec in header.items():
        tensors[name] = _tensor_info(path, name, spec, data_start, size)
    _check_layout(path, tensors, data_start, size)
    return SafetensorsHeader(path=path, tensors=tensors, metadata=dict(metadata))


def _check_layout(path: Path, tensors: dict[str, TensorInfo], data_start: int, size: int) -> None:
    """The tensors tile the data section exactly, in offset order, as safetensors itself requires to load:
    no overlap (two tensors sharing bytes would both change when one is merged), no gap, nothing after."""
    position = data_start
    for info in sorted(tensors.values(), key=lambda i: (i.start, i.end)):
        if info.start != position:
            what = "overlaps the tensor before it" if info.start < position else "leaves a gap before it"
            raise _bad(path, f"tensor '{info.name}' starts at data byte {info.start - data_start}, which {what} "
                             f"(expected {position - data_start})")
        position = info.end
    if position != size:
        raise _bad(path, f"the tensors end at byte {position} but the file has {size} bytes")


def _tensor_info(path: Path, name: str, spec: object, data_start: int, size: int) -> TensorInfo:
    if not isinstance(spec, dict) or not {"dtype", "shape", "data_offsets"} <= spec.keys():
        raise _bad(path, f"tensor '{name}' has a malformed header entry")
    dtype = spec["dtype"]
    if dtype not in DTYPE_SIZES:
        raise _bad(path, f"tensor '{name}' has unknown dtype {dtype!r}")
    shape_spec, offsets = spec["shape"], spec["data_offsets"]
    if not isinstance(shape_spec, list) or not all(_is_count(d) for d in shape_spec):
        raise _bad(path, f"tensor '{name}' has shape {shape_spec!r}, not a list of non-negative integers")
    if not isinstance(offsets, list) or len(offsets) != 2 or not all(_is_count(x) for x in offsets) \
            or offsets[0] > offsets[1]:
        raise _bad(path, f"tensor '{name}' has data_offsets {offsets!r}, not [begin, end] with 0 <= begin <= end")
    shape = tuple(shape_spec)
    begin, end = offsets
    expected = prod(shape) * DTYPE_SIZES[dtype]
    if end - begin != expected:
        raise _bad(path, f"tensor '{name}' spans {end - begin} bytes, its {dtype}{list(shape)} needs {expected}")
    if data_start + end > size:
        raise _bad(
            path,
            f"tensor '{name}' ends at byte {data_start + end} but the file has {size} bytes (truncated?)",
        )
    return TensorInfo(name=name, dtype=dtype, shape=shape, start=data_start + begin, end=data_start + end)


def _is_positive(value: object) -> bool:
    return _is_count(value) and value != 0


def _is_count(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


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


# Optional config.json fields the exporters read, by the JSON type they must have when present. A wrong
# type here fails deep inside the model builder (exit 4, after seconds of work) instead of at intake.
_CONFIG_TYPES: dict[str, tuple[str, tuple[type, ...]]] = {
    "model_type": ("a string", (str,)),
    "hidden_act": ("a string", (str,)),
    "torch_dtype": ("a string", (str,)),
    "rms_norm_eps": ("a positive number", (int, float)),
    "layer_norm_eps": ("a positive number", (int, float)),
    "layer_norm_epsilon": ("a positive number", (int, float)),
    "rope_theta": ("a positive number", (int, float)),
    "tie_word_embeddings": ("true or false", (bool,)),
    "attention_bias": ("true or false", (bool,)),
    "mlp_bias": ("true or false", (bool,)),
}
_TOKEN_IDS = ("bos_token_id", "eos_token_id", "pad_token_id")
# The sizes the exporters and the memory plan read (memory/shape.py), by their names across families:
# each group must be present once, every name that is present (not null) must be a positive integer.
_SIZES = {
    "layers": ("num_hidden_layers", "n_layer", "num_layers"),
    "hidden": ("hidden_size", "n_embd"),
    "heads": ("num_attention_heads", "n_head"),
    "vocab": ("vocab_size",),
}
_OPTIONAL_SIZES = ("intermediate_size", "n_inner", "ffn_hidden_size", "max_position_embeddings", "n_positions",
                   "num_key_value_heads", "head_dim", "sliding_window")


def check_config_fields(config: dict[str, object], source: str = "config.json") -> None:
    """Refuse a config.json whose sizes are not positive integers or whose fields have the wrong JSON type,
    naming the field: the model builder would otherwise fail on it seconds later (an infrastructure error)."""
    def refuse(key: str, want: str) -> InputError:
        return InputError(f"{source}: '{key}' is {config[key]!r}, not {want}",
                          hint="fix config.json or re-save it with transformers' save_pretrained")

    for names in _SIZES.values():
        if all(config.get(n) is None for n in names):
            raise InputError(f"{source}: no '{names[0]}'",
                             hint="config.json must give the layer count, hidden size, attention heads and vocab size")
    for key in (*[n for names in _SIZES.values() for n in names], *_OPTIONAL_SIZES):
        if config.get(key) is not None and not _is_positive(config[key]):
            raise refuse(key, "a positive integer")
    heads = next(config[n] for n in _SIZES["heads"] if config.get(n) is not None)
    kv_heads = config.get("num_key_value_heads")
    if isinstance(heads, int) and isinstance(kv_heads, int) and heads % kv_heads:
        raise InputError(f"{source}: num_attention_heads {heads} is not a multiple of num_key_value_heads "
                         f"{kv_heads}", hint="check the attention fields of config.json")
    for key, (want, types) in _CONFIG_TYPES.items():
        value = config.get(key)
        if value is None and key != "model_type":
            continue
        if not isinstance(value, types):
            raise refuse(key, want)
        if types == (int, float) and (isinstance(value, bool) or not 0 < float(value) < float("inf")):  # type: ignore[arg-type]
            raise refuse(key, want)
    architectures = config.get("architectures")
    if architectures is not None and (not isinstance(architectures, list)
                                      or not all(isinstance(a, str) for a in architectures)):
        raise refuse("architectures", "a list of strings")
    for key in _TOKEN_IDS:
        value = config.get(key)
        ids = value if isinstance(value, list) else [value]
        if value is not None and not all(_is_count(i) for i in ids):
            raise refuse(key, "a non-negative integer (or a list of them)")


def read_weight_map(index_path: Path) -> dict[str, str]:
    """The index's weight_map (tensor name -> shard file name), read by the one loader, its types checked."""
    from release.core.jsonfile import expect, load_json_object  # noqa: PLC0415

    hint, label = "re-save the sharded checkpoint", f"{index_path.parent.name}/{index_path.name}"
    weight_map = expect(load_json_object(index_path, hint, label), "weight_map", dict, label, hint)
    for tensor, shard in weight_map.items():
        if not isinstance(shard, str) or "/" in shard or shard in ("", ".", ".."):
            raise InputError(f"{label}: 'weight_map.{tensor}' is not a shard file name", hint=hint)
    return dict(weight_map)


def weight_files(folder: Path) -> list[Path]:
    """The base model's safetensors files, in index order when the checkpoint is sharded."""
    index_path = folder / "model.safetensors.index.json"
    if index_path.is_file():
        weight_map = read_weight_map(index_path)
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
    weight_map = read_weight_map(index_path)
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
