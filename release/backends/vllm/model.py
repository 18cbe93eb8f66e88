"""A vLLM package as validation and the offline gates see it: a vLLM server this process starts, asked
over HTTP. Greedy generation and the tokenizer are vLLM's own (/v1/completions, /tokenize, /detokenize);
teacher-forced log-probabilities come from `prompt_logprobs` (the distribution before each prompt token)
plus the first generated token's `logprobs` (the one after the last), token ids as keys.

vLLM returns the top-k log-probabilities of each position (k up to --max-logprobs), not logits. `logits`
returns log-probabilities (equal to logits up to a per-row constant, so every softmax over them is the
same), exact when k covers the vocabulary (small vocabularies: the server is started with k = vocab up to
MAX_FULL_VOCAB). Beyond it, each row holds the top k exactly, the prompt token's own log-probability
exactly (vLLM always returns it), and the rest of the probability mass spread evenly over the tokens not
returned: top-1 agreement and perplexity stay exact, KL is computed over the returned top-k plus one
remainder bucket.

One server per model folder per process (shared by validation, the eval and safety gates of one
promote), stopped when the process exits.
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import TYPE_CHECKING, Any

import httpx
import numpy as np

from release.backends.folder_facts import FolderFacts, model_facts
from release.backends.processes import free_port
from release.backends.vllm.adapters import with_lora
from release.backends.vllm.engine import EngineProcess, log_path
from release.core.tokenizer_file import load_tokenizer

if TYPE_CHECKING:
    from release.backends.vllm import VllmBackend

SERVED_NAME = "candidate"
BASE_NAME = "base"      # the base's name when SERVED_NAME is an adapter on it
MAX_FULL_VOCAB = 4096   # up to this vocabulary size, every position's whole distribution is returned
TOP_K = 20              # beyond it, the top k per position (vLLM's default --max-logprobs)

_models: dict[tuple[Path, Path | None], VllmModel] = {}
_lock = threading.Lock()


def served_model(backend: VllmBackend, model_dir: Path, adapter: Path | None = None) -> VllmModel:
    """The running server for `model_dir` (with the LoRA adapter folder `adapter` active), started on first use."""
    key = (model_dir.resolve(), adapter.resolve() if adapter else None)
    with _lock:
        model = _models.get(key)
        if model is None or not model.alive():
            model = VllmModel.start(backend, *key)
            _models[key] = model
        return model


class VllmModel(FolderFacts):
    """LoadedModel over a vLLM server (thread-safe: httpx clients are)."""

    def __init__(self, model_dir: Path, engine: EngineProcess, top_k: int) -> None:
        self.model_dir = model_dir
        self.engine = engine
        self.top_k = top_k
        config = self._read_facts(model_dir)
        self.vocab_size = int(config["vocab_size"])
        self._http = httpx.Client(base_url=engine.url, timeout=300)
        self._tokenizer = load_tokenizer(model_dir / "tokenizer.json")

    @classmethod
    def start(cls, backend: VllmBackend, model_dir: Path, adapter: Path | None = None) -> VllmModel:
        config, _ = model_facts(model_dir)
        vocab = int(config["vocab_size"])
        top_k = vocab if vocab <= MAX_FULL_VOCAB else TOP_K
        port = free_port()
        # With an adapter, the base serves under another name and SERVED_NAME is the adapter: every request
        # below (tokenize, completions, log-probabilities) then runs base + adapter as vLLM serves them.
        served = BASE_NAME if adapter else SERVED_NAME
        command = backend.server_command(model_dir, served, "127.0.0.1", port, max_logprobs=top_k)
        if adapter is not None:
            command = with_lora(command, {SERVED_NAME: adapter})
        engine = EngineProcess(command, f"http://127.0.0.1:{port}", log_path("validate", port)).start()
        return cls(model_dir, engine, top_k)

    def alive(self) -> bool:
        return self.engine.alive()

    def close(self) -> None:
        self._http.close()
        self.engine.stop()


    def _post(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        response = self._http.post(path, json={"model": SERVED_NAME, **body})
        if response.status_code != 200:
            raise RuntimeError(f"vLLM {path}: HTTP {response.status_code}: {response.text[:300]}")
        data: dict[str, Any] = response.json()
        return data

    def encode(self, text: str) -> list[int]:
        return [int(t) for t in self._post("/tokenize", {"prompt": text})["tokens"]]

    def decode(self, ids: list[int]) -> str:
        # The package's tokenizer.json (the file vLLM loads), special tokens skipped as every backend's
        # decode does; vLLM's /detokenize keeps them. Encoding goes through vLLM: tokenizer parity checks it.
        return str(self._tokenizer.decode(ids))

    def _complete(self, ids: list[int], max_new_tokens: int) -> dict[str, Any]:
        body = {"prompt": ids, "max_tokens": max_new_tokens, "temperature": 0.0, "return_token_ids": True}
        choice: dict[str, Any] = self._post("/v1/completions", body)["choices"][0]
        return choice

    def generate_ids(self, input_ids: list[int], max_new_tokens: int) -> list[int]:
        budget = min(max_new_tokens, self._context - len(input_ids))
        if budget <= 0:
            return []
        return [int(t) for t in self._complete(input_ids, budget)["token_ids"]]

    def logits(self, ids: list[int]) -> np.ndarray:
        """Teacher-forced log-probabilities, shape (len(ids), vocab): row i is the distribution after ids[:i+1]."""
        body = {"prompt": ids, "max_tokens": 1, "temperature": 0.0, "prompt_logprobs": self.top_k,
                "logprobs": self.top_k, "return_tokens_as_token_ids": True}
        choice = self._post("/v1/completions", body)["choices"][0]
        rows: list[dict[int, float]] = []
        for position in choice["prompt_logprobs"][1:]:  # entry i+1 is the distribution that predicted ids[i+1]
            rows.append({int(token): float(entry["logprob"]) for token, entry in position.items()})
        last = choice["logprobs"]["top_logprobs"][0]
        rows.append({int(token.removeprefix("token_id:")): float(value) for token, value in last.items()})
        return self._dense(rows)

    def _dense(self, rows: list[dict[int, float]]) -> np.ndarray:
        out = np.empty((len(rows), self.vocab_size), dtype=np.float32)
        for i, row in enumerate(rows):
            missing = self.vocab_size - len(row)
            if missing > 0:
                # The mass vLLM did not return, spread evenly (a floor far below any returned one when
                # the returned tokens carry it all, so no row is -inf).
                rest = max(1.0 - float(np.exp(np.fromiter(row.values(), dtype=np.float64)).sum()), 1e-30)
                out[i, :] = np.log(rest / missing)
            for token, logprob in row.items():
                out[i, token] = logprob
        return out
