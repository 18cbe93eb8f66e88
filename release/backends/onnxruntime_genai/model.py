"""The onnxruntime-genai backend's LoadedModel: onnxruntime-genai for tokenizing and generating, a plain
onnxruntime.InferenceSession on model.onnx for teacher-forced logits. The one place a genai model folder is
opened for validation and the offline gates; the server's runner shares `open_tokenizer`, so the tokenizer
checked for parity is exactly the one that serves.

Tokenizer note: onnxruntime-genai 0.18 tokenizes with add_special_tokens off by default, so it drops
the BOS that the training tokenizer's post-processor adds, whatever tokenizer_config.json says.
`open_tokenizer` switches it on; the BOS then comes from tokenizer.json's post-processor
(onnxruntime-extensions reads it) exactly as `tokenizers.Tokenizer.encode` adds it.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np

from release.backends.base import Generation
from release.core.errors import InputError
from release.core.jsonfile import read_json_file

GENAI_CONFIG = "genai_config.json"
MODEL_FILE = "model.onnx"

# ONNX tensor type strings -> numpy dtypes for the empty past-KV inputs.
_ORT_DTYPES: dict[str, Any] = {
    "tensor(float)": np.float32,
    "tensor(float16)": np.float16,
    "tensor(double)": np.float64,
    "tensor(bfloat16)": np.float32,  # never produced by the CPU builder; refused below
}


def read_genai_config(model_dir: Path) -> dict[str, Any]:
    """genai_config.json of a converted folder; InputError when the folder is not a genai model."""
    path = model_dir / GENAI_CONFIG
    missing = InputError(
        f"{model_dir.name}: {GENAI_CONFIG} is missing (not an onnxruntime-genai model folder)",
        hint="convert the checkpoint first (relctl promote, or relctl convert)",
    )
    data = read_json_file(path, missing, fix_hint="re-run convert")
    if not isinstance(data, dict) or "model" not in data:
        raise InputError(f"{path.name}: no 'model' section", hint="re-run convert")
    return data


def kv_floor(genai_config: dict[str, Any]) -> int:
    """The smallest KV capacity a genai model runs with: 0, or its sliding window when the builder gave the
    window layers a bounded cache (GroupQueryAttention refuses a smaller one, whatever the prompt)."""
    window = genai_config["model"]["decoder"].get("sliding_window") or {}
    return int(window.get("window_size", 0)) if window.get("layers") else 0


def open_tokenizer(model: Any) -> Any:
    """The og.Tokenizer of a loaded og.Model (or of an og.Config: the tokenizer alone, no weights loaded),
    configured to add special tokens like the training one."""
    import onnxruntime_genai as og  # noqa: PLC0415 - loads native libraries; only when a model is loaded

    tokenizer = og.Tokenizer(model)
    tokenizer.update_options(add_special_tokens="true")
    return tokenizer


class GenaiTokens:
    """What a model read from an onnxruntime-genai folder says of its tokens: the served tokenizer and the
    EOS ids of genai_config.json (shared by the og.Model path and the lean CPU path)."""

    _tokenizer: Any
    _config: dict[str, Any]

    @property
    def eos_token_ids(self) -> list[int]:
        eos = self._config["model"].get("eos_token_id", [])
        return [int(e) for e in (eos if isinstance(eos, list) else [eos])]

    def encode(self, text: str) -> list[int]:
        """Token ids exactly as the served model sees `text` (special tokens such as BOS included)."""
        return [int(i) for i in self._tokenizer.encode(text)]

    def decode(self, ids: list[int]) -> str:
        return str(self._tokenizer.decode(np.asarray(ids, dtype=np.int32)))


class GenaiModel(GenaiTokens):
    """A converted model folder, loaded once; thread-safe for concurrent generate/logits calls."""

    def __init__(self, model_dir: Path, model: Any, tokenizer: Any, genai_config: dict[str, Any]) -> None:
        self.model_dir = model_dir
        self._model = model
        self._tokenizer = tokenizer
        self._config = genai_config
        self._session: Any = None
        self._session_lock = threading.Lock()

    @staticmethod
    def served_tokenizer(model_dir: Path) -> Callable[[str], list[int]]:
        """`encode` as the served model tokenizes, from the folder's config and tokenizer files alone (the
        weights are not loaded: an fp32 1.5B model is 6 GB)."""
        import onnxruntime_genai as og  # noqa: PLC0415

        tokenizer = open_tokenizer(og.Config(str(model_dir)))
        return lambda text: [int(i) for i in tokenizer.encode(text)]

    @classmethod
    def load(cls, model_dir: Path, execution_provider: str = "cpu") -> GenaiModel:
        """Load `model_dir` (model.onnx + genai_config.json + tokenizer files) for `execution_provider`."""
        import onnxruntime_genai as og  # noqa: PLC0415 - loads native libraries; only when a model is loaded

        config_data = read_genai_config(model_dir)
        if not (model_dir / MODEL_FILE).is_file():
            raise InputError(f"{model_dir.name}: {MODEL_FILE} is missing", hint="re-run convert")
        config = og.Config(str(model_dir))
        config.clear_providers()
        if execution_provider != "cpu":
            config.append_provider(execution_provider)
        model = og.Model(config)
        return cls(model_dir, model, open_tokenizer(model), config_data)

    @property
    def context_length(self) -> int:
        return int(self._config["model"].get("context_length", 0)) or 2048

    @property
    def kv_floor(self) -> int:
        """The smallest KV capacity the model runs with: 0, or its sliding window when the builder gave the
        window layers a bounded cache (GroupQueryAttention refuses a smaller one, whatever the prompt)."""
        return kv_floor(self._config)

    def generate(self, prompt: str, max_new_tokens: int) -> Generation:
        """Greedy completion of `prompt`, at most `max_new_tokens` new tokens."""
        ids = self.encode(prompt)
        generated = list(self._greedy(ids, max_new_tokens))
        finish = "stop" if generated and generated[-1] in self.eos_token_ids else "length"
        return Generation(
            text=self.decode(generated),
            token_ids=generated,
            prompt_tokens=len(ids),
            finish_reason=finish,
        )

    def generate_ids(self, input_ids: list[int], max_new_tokens: int) -> list[int]:
        """Greedy continuation of already-tokenized input (used to compare with transformers)."""
        return list(self._greedy(list(input_ids), max_new_tokens))

    def _greedy(self, input_ids: list[int], max_new_tokens: int) -> Iterator[int]:
        import onnxruntime_genai as og  # noqa: PLC0415 - loads native libraries; only when a model is loaded

        if not input_ids:
            raise InputError("prompt: tokenizes to no tokens", hint="give a non-empty prompt")
        if max_new_tokens < 1:
            raise InputError(f"max_new_tokens: {max_new_tokens} is below 1", hint="ask for at least one token")
        if len(input_ids) >= self.context_length:
            raise InputError(
                f"prompt: {len(input_ids)} tokens, the model's context is {self.context_length}",
                hint="shorten the prompt",
            )
        params = og.GeneratorParams(self._model)
        # At least the KV floor (a sliding-window model), so the stop after max_new_tokens is counted here.
        max_length = min(max(len(input_ids) + max_new_tokens, self.kv_floor), self.context_length)
        params.set_search_options(max_length=max_length, do_sample=False, num_beams=1)
        generator = self._generator(params)
        generator.append_tokens(np.asarray(input_ids, dtype=np.int32))
        for _ in range(max_new_tokens):
            if generator.is_done():
                return
            generator.generate_next_token()
            yield int(generator.get_next_tokens()[0])

    def logits(self, ids: list[int]) -> np.ndarray:
        """Teacher-forced logits for `ids`, shape (len(ids), vocab), float32: the graph's logits output for
        the whole sequence, read from the loaded og.Model's own run (the same session and numbers as
        model.onnx run directly, without loading the weights a second time); a sequence at the context's
        end, which a generator cannot hold, runs model.onnx in a separate onnxruntime session."""
        if not ids:
            raise InputError("logits: no token ids given", hint="pass at least one token id")
        if len(ids) < self.context_length:
            return self._generator_logits(ids)
        session = self._inference_session()
        feeds = self._feeds(session, ids)
        (logits,) = session.run(["logits"], feeds)
        return np.asarray(logits[0], dtype=np.float32)

    def _generator_logits(self, ids: list[int]) -> np.ndarray:
        import onnxruntime_genai as og  # noqa: PLC0415 - native libraries; only when a model is loaded

        params = og.GeneratorParams(self._model)
        max_length = min(max(len(ids) + 1, self.kv_floor), self.context_length)
        params.set_search_options(max_length=max_length, do_sample=False, num_beams=1)
        generator = self._generator(params)
        generator.append_tokens(np.asarray(ids, dtype=np.int32))
        logits = np.asarray(generator.get_output("logits"), dtype=np.float32)
        return np.array(logits[0, -len(ids):], dtype=np.float32)

    def _generator(self, params: Any) -> Any:
        """A generator of the loaded model (a subclass may set an adapter active on it)."""
        import onnxruntime_genai as og  # noqa: PLC0415 - native libraries; only when a model is loaded

        return og.Generator(self._model, params)

    def _inference_session(self) -> Any:
        # Created on first use: a server that only generates never holds the weights twice.
        with self._session_lock:
            if self._session is None:
                import onnxruntime as ort  # noqa: PLC0415 - loads native libraries; only when a graph is run

                options = ort.SessionOptions()
                options.log_severity_level = 3
                self._session = ort.InferenceSession(
                    str(self.model_dir / MODEL_FILE), options, providers=["CPUExecutionProvider"]
                )
            return self._session

    def _feeds(self, session: Any, ids: list[int]) -> dict[str, np.ndarray]:
        decoder = self._config["model"]["decoder"]
        kv_heads = int(decoder.get("num_key_value_heads", decoder["num_attention_heads"]))
        head_size = int(decoder["head_size"])
        window = decoder.get("sliding_window") or {}
        # A bounded sliding-window cache is fed at its full capacity (empty: the mask says how much is used).
        windowed = {int(i) for i in window.get("layers", [])}
        length = len(ids)
        feeds: dict[str, np.ndarray] = {}
        for graph_input in session.get_inputs():
            name = graph_input.name
            if name == "input_ids":
                feeds[name] = np.asarray([ids], dtype=np.int64)
            elif name == "attention_mask":
                feeds[name] = np.ones((1, length), dtype=np.int64)
            elif name == "position_ids":
                feeds[name] = np.arange(length, dtype=np.int64)[None, :]
            elif name.startswith("past_key_values."):
                if graph_input.type not in _ORT_DTYPES or graph_input.type == "tensor(bfloat16)":
                    raise InputError(
                        f"{MODEL_FILE}: past KV input {name} has unsupported type {graph_input.type}",
                        hint="convert for the cpu execution provider (fp32, fp16, int8 or int4)",
                    )
                past = self.kv_floor if int(name.split(".")[1]) in windowed else 0
                feeds[name] = np.zeros((1, kv_heads, past, head_size), dtype=_ORT_DTYPES[graph_input.type])
            else:
                raise InputError(
                    f"{MODEL_FILE}: unexpected graph input '{name}'",
                    hint="this folder was not built by onnxruntime-genai's model builder",
                )
        return feeds
