"""A GGUF package as validation and the offline gates see it: llama-server, started by this process, asked
over HTTP. Everything is llama.cpp's own: the tokenizer (/tokenize with its BOS rule, /detokenize), greedy
generation (/completion at temperature 0) and the log-probabilities.

Teacher-forced log-probabilities: llama-server returns, for each token it generates, the softmax of the
raw logits (`n_probs` top entries, pre-sampling, as log-probabilities), not the prompt's. Row i (the
distribution after ids[:i+1]) is therefore asked as a one-token completion of that prefix; the server's
prompt cache reuses the previous prefix's KV, so each request evaluates one new token. `n_probs` is the
whole vocabulary up to MAX_FULL_VOCAB (exact rows); above it the top TOP_K entries per row plus the rest of
the mass spread evenly, as release/backends/vllm/model.py does (top-1 exact, KL over top-k plus a bucket).

One server per model folder per process (shared by validation and the offline gates), stopped at exit.
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from release.backends.base import Generation
from release.backends.llama_cpp.gguf_facts import GGUF_FILE, GgufFacts, read_gguf
from release.backends.llama_cpp.server import ServerProcess, log_path
from release.backends.processes import free_port

if TYPE_CHECKING:
    from release.backends.llama_cpp import LlamaCppBackend

SERVED_NAME = "candidate"
MAX_FULL_VOCAB = 4096
TOP_K = 64
# log(p) of a probability float32 cannot hold: llama-server writes FLT_LOWEST for p == 0.
LOGPROB_FLOOR = -104.0

_models: dict[Path, LlamaServerModel] = {}
_lock = threading.Lock()


def served_model(backend: LlamaCppBackend, model_dir: Path) -> LlamaServerModel:
    """The running server for `model_dir`, started on first use."""
    key = model_dir.resolve()
    with _lock:
        model = _models.get(key)
        if model is None or not model.server.alive():
            model = LlamaServerModel.start(backend, key)
            _models[key] = model
        return model


class LlamaServerModel:
    """LoadedModel over one llama-server (one slot: requests are serialized, so the prompt cache holds)."""

    def __init__(self, model_dir: Path, server: ServerProcess, facts: GgufFacts) -> None:
        import httpx  # noqa: PLC0415 - only a loaded model needs it

        self.model_dir = model_dir
        self.server = server
        self.facts = facts
        self.top_k = facts.vocab_size if facts.vocab_size <= MAX_FULL_VOCAB else TOP_K
        self._http = httpx.Client(base_url=server.url, timeout=300)
        self._lock = threading.Lock()

    @classmethod
    def start(cls, backend: LlamaCppBackend, model_dir: Path) -> LlamaServerModel:
        facts = read_gguf(model_dir / GGUF_FILE)
        port = free_port()
        command = backend.engine_command(model_dir, SERVED_NAME, "127.0.0.1", port, slots=1)
        server = ServerProcess(command, f"http://127.0.0.1:{port}", log_path("validate", port)).start()
        return cls(model_dir, server, facts)

    def close(self) -> None:
        self._http.close()
        self.server.stop()

    @property
    def context_length(self) -> int:
        return self.facts.context_length

    @property
    def eos_token_ids(self) -> list[int]:
        return [] if self.facts.eos_token_id is None else [self.facts.eos_token_id]

    def _post(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        with self._lock:  # one slot: a second request would evict the first's cached prefix
            response = self._http.post(path, json=body)
        if response.status_code != 200:
            raise RuntimeError(f"llama-server {path}: HTTP {response.status_code}: {response.text[:300]}")
        data: dict[str, Any] = response.json()
        return data

    def encode(self, text: str) -> list[int]:
        # add_special: BOS as the GGUF's tokenizer.ggml.add_bos_token says; parse_special: "<s>" in the text
        # is the BOS token, as tokenizers' encode treats added special tokens.
        tokens = self._post("/tokenize", {"content": text, "add_special": True, "parse_special": True})["tokens"]
        return [int(t) for t in tokens]

    def decode(self, ids: list[int]) -> str:
        # Control tokens (BOS, EOS, PAD) skipped, as every backend's decode does; llama.cpp renders them.
        kept = [i for i in ids if i not in self.facts.control_token_ids]
        return str(self._post("/detokenize", {"tokens": kept})["content"])

    def _complete(self, ids: list[int], max_new_tokens: int, n_probs: int = 0) -> dict[str, Any]:
        return self._post("/completion", {"prompt": ids, "n_predict": max_new_tokens, "temperature": 0.0,
                                          "n_probs": n_probs, "return_tokens": True, "cache_prompt": True})

    def generate_ids(self, input_ids: list[int], max_new_tokens: int) -> list[int]:
        budget = min(max_new_tokens, self.context_length - len(input_ids))
        if budget <= 0:
            return []
        return [int(t) for t in self._complete(input_ids, budget)["tokens"]]

    def generate(self, prompt: str, max_new_tokens: int) -> Generation:
        ids = self.encode(prompt)
        generated = self.generate_ids(ids, max_new_tokens)
        finish = "stop" if generated and generated[-1] in self.eos_token_ids else "length"
        return Generation(text=self.decode(generated), token_ids=generated, prompt_tokens=len(ids),
                          finish_reason=finish)

    def logits(self, ids: list[int]) -> np.ndarray:
        """Log-probabilities, shape (len(ids), vocab): row i is the distribution after ids[:i+1]."""
        rows = []
        for end in range(1, len(ids) + 1):
            step = self._complete(ids[:end], 1, n_probs=self.top_k)["completion_probabilities"][0]
            rows.append({int(e["id"]): max(float(e["logprob"]), LOGPROB_FLOOR) for e in step["top_logprobs"]})
        return self._dense(rows)

    def _dense(self, rows: list[dict[int, float]]) -> np.ndarray:
        vocab = self.facts.vocab_size
        out = np.empty((len(rows), vocab), dtype=np.float32)
        for i, row in enumerate(rows):
            missing = vocab - len(row)
            if missing > 0:
                rest = max(1.0 - float(np.exp(np.fromiter(row.values(), dtype=np.float64)).sum()), 1e-30)
                out[i, :] = np.log(rest / missing)
            for token, logprob in row.items():
                out[i, token] = logprob
        return out
