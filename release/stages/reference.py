"""Reference: what the checkpoint itself computes on the validation prompts, computed once and kept on disk.

For each prompt (tokenized with the training tokenizer): the reference's greedy continuation
(max_new_tokens) and, at every position of prompt + continuation, its top-k log-probabilities (the whole
distribution when the vocabulary is small), the log-probability of the token that follows, all in one
`reference.npz`. Validation compares a candidate with this file (release/stages/validate.py), so:
- the model that computed it is gone before the candidate loads (peak memory is the larger of the two,
  never their sum), and it runs in its own process (its peak is reported, and it ends with relctl);
- it is computed once per checkpoint, prompt set and max_new_tokens: the stage's fingerprint has no
  precision in it, so an int4 and an int8 promote of one run share it;
- a backend whose reference is the checkpoint (`Backend.reference_from_checkpoint`)
  needs no fp32 build just to be compared with: the builder runs once per promote, and an fp32 release is
  compared with PyTorch's numbers, not with itself.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from pydantic import Field

from release.backends.base import LoadedModel
from release.core.errors import InputError, StageFailed
from release.core.subprocs import start_child, stop_child
from release.core.tokenizer_file import load_tokenizer
from release.core.units import size
from release.stages.base import Stage, StageInputs, StageResult, location

REFERENCE_FILE = "reference.npz"
FULL_VOCAB = 4096   # up to this vocabulary size every position keeps its whole distribution
TOP_K = 64          # beyond it, the top k per position (plus the next token's own log-probability)


@dataclass(frozen=True)
class PromptReference:
    """One prompt's reference: its ids, the greedy continuation, and per position (prompt + continuation)
    the top-k token ids and log-probabilities (descending) and the next token's log-probability."""

    ids: list[int]
    continuation: list[int]
    top_ids: np.ndarray      # int32 (positions, k)
    top_logprobs: np.ndarray  # float64 (positions, k)
    next_logprobs: np.ndarray  # float64 (positions - 1,)
    vocab: int

    @property
    def sequence(self) -> list[int]:
        return self.ids + self.continuation


def top2_margins(ref: PromptReference) -> np.ndarray:
    """Per position, how far apart the reference's two most likely tokens are: log p1 - log p2 in nats (inf
    with a one-token vocabulary). Read from the recorded top-k log-probabilities (descending), so a saved
    reference needs nothing new; validation's tie-aware top-1 agreement skips positions where it is tiny."""
    logprobs = np.asarray(ref.top_logprobs, dtype=np.float64)
    if logprobs.shape[1] < 2:
        return np.full(len(logprobs), np.inf)
    margins: np.ndarray = logprobs[:, 0] - logprobs[:, 1]
    return margins


def log_softmax(logits: np.ndarray) -> np.ndarray:
    shifted = logits - logits.max(axis=-1, keepdims=True)
    result: np.ndarray = shifted - np.log(np.exp(shifted).sum(axis=-1, keepdims=True))
    return result


def summarize(ids: list[int], continuation: list[int], logits: np.ndarray) -> PromptReference:
    """Keep what validation needs from the reference's logits of ids + continuation."""
    logp = log_softmax(logits.astype(np.float64))
    vocab = logp.shape[-1]
    k = vocab if vocab <= FULL_VOCAB else TOP_K
    top = np.argpartition(-logp, k - 1, axis=-1)[:, :k] if k < vocab else np.tile(np.arange(vocab), (len(logp), 1))
    rows = np.arange(len(logp))[:, None]
    # Descending, ties by token id: the first column is exactly argmax's choice.
    order = np.lexsort((top, -logp[rows, top]), axis=-1)
    top = np.take_along_axis(top, order, axis=-1)
    sequence = np.asarray(ids + continuation)
    return PromptReference(ids=list(ids), continuation=list(continuation), top_ids=top.astype(np.int32),
                           top_logprobs=logp[rows, top],
                           next_logprobs=logp[np.arange(len(sequence) - 1), sequence[1:]], vocab=vocab)


def compute(reference: LoadedModel, token_ids: list[list[int]], max_new_tokens: int) -> list[PromptReference]:
    """Each prompt's continuation and summarized logits from `reference`."""
    batched = getattr(reference, "batch_generate_with_logits", None)
    if batched is not None:  # a batch per weight pass (release/backends/torch_reference.py)
        return [summarize(ids, continuation, logits)
                for ids, (continuation, logits) in zip(token_ids, batched(token_ids, max_new_tokens), strict=True)]
    out = []
    for ids in token_ids:
        continuation = reference.generate_ids(ids, max_new_tokens)
        out.append(summarize(ids, continuation, reference.logits(ids + continuation)))
    return out


def save(path: Path, refs: list[PromptReference], max_new_tokens: int) -> None:
    arrays: dict[str, Any] = {"max_new_tokens": np.asarray(max_new_tokens), "count": np.asarray(len(refs))}
    for i, ref in enumerate(refs):
        arrays.update({f"ids_{i}": np.asarray(ref.ids, dtype=np.int64),
                       f"continuation_{i}": np.asarray(ref.continuation, dtype=np.int64),
                       f"top_ids_{i}": ref.top_ids, f"top_logprobs_{i}": ref.top_logprobs,
                       f"next_logprobs_{i}": ref.next_logprobs, f"vocab_{i}": np.asarray(ref.vocab)})
    with path.open("wb") as fh:
        np.savez(fh, **arrays)


def load(path: Path, token_ids: list[list[int]], max_new_tokens: int) -> list[PromptReference]:
    """The saved reference, checked to be for these prompt ids and max_new_tokens."""
    with np.load(path) as data:
        count = int(data["count"])
        refs = [PromptReference(ids=[int(x) for x in data[f"ids_{i}"]],
                                continuation=[int(x) for x in data[f"continuation_{i}"]],
                                top_ids=data[f"top_ids_{i}"], top_logprobs=data[f"top_logprobs_{i}"],
                                next_logprobs=data[f"next_logprobs_{i}"], vocab=int(data[f"vocab_{i}"]))
                for i in range(count)]
        saved_tokens = int(data["max_new_tokens"])
    if saved_tokens != max_new_tokens or [r.ids for r in refs] != token_ids:
        raise InputError(f"{path}: this reference was computed for other prompts or max_new_tokens "
                         f"({count} prompts, {saved_tokens} new tokens)",
                         hint="compute the reference again for these prompts (promote does it by itself)")
    return refs


def token_ids_of(prompts: list[str], tokenizer: Path) -> list[list[int]]:
    if not tokenizer.is_file():
        raise InputError(f"{tokenizer}: training tokenizer not found", hint="pass the checkpoint's tokenizer.json")
    tok = load_tokenizer(tokenizer)
    return [list(tok.encode(p).ids) for p in prompts]


class ReferenceInputs(StageInputs):
    upstream: str = Field(description="fingerprint of the stage that produced the checkpoint")
    backend: str = Field(description="the backend whose load_reference computes it")
    prompts_sha256: str
    max_new_tokens: int
    format: int = 1  # REFERENCE_FILE's layout
    checkpoint: Path = location()
    prompts_path: Path = location()


class ReferenceResult(StageResult):
    file: str = REFERENCE_FILE
    prompts: int
    positions: int
    top_k: int
    peak_rss_bytes: int
    seconds: float


class ReferenceStage(Stage[ReferenceInputs, ReferenceResult]):
    """The checkpoint's own numbers on the validation prompts, computed once in a worker process."""

    name = "reference"
    result_type = ReferenceResult

    def run(self, out: Path) -> ReferenceResult:
        i = self.inputs
        log_path = out / "reference.log"
        cmd = [sys.executable, "-m", "release.stages.reference_worker", "--backend", i.backend,
               "--checkpoint", str(i.checkpoint), "--prompts", str(i.prompts_path),
               "--max-new-tokens", str(i.max_new_tokens), "--out", str(out / REFERENCE_FILE)]
        with log_path.open("w") as log:
            proc = start_child(cmd, stdout=log, stderr=subprocess.STDOUT)
            try:
                proc.wait()
            except BaseException:
                stop_child(proc, timeout_s=10)
                raise
        facts = out / "reference.json"
        if proc.returncode != 0 or not facts.is_file():
            lines = [ln for ln in log_path.read_text(errors="replace").splitlines() if ln.strip()]
            last = lines[-1][-300:] if lines else "(empty log)"
            if proc.returncode == 2 and last.startswith("error: "):
                raise InputError(last.removeprefix("error: "), hint=f"see {log_path}")
            raise StageFailed(f"reference: the reference model failed on the checkpoint (exit {proc.returncode}): "
                              f"{last}", hint=f"see the full log in {log_path}")
        return ReferenceResult.model_validate(json.loads(facts.read_text()))

    def summary(self, result: ReferenceResult) -> str:
        return (f"{result.prompts} prompts, {result.positions} positions (top-{result.top_k}), "
                f"peak {size(result.peak_rss_bytes)}")


def run_worker(backend_id: str, checkpoint: Path, prompts_path: Path, max_new_tokens: int, out: Path) -> None:
    """The worker's body: load the backend's reference on `checkpoint`, write REFERENCE_FILE and its facts."""
    import resource  # noqa: PLC0415 - POSIX only, like the worker

    from release.backends import get_backend  # noqa: PLC0415
    from release.stages.validate import load_prompts  # noqa: PLC0415 - validate imports this module

    started = time.perf_counter()
    token_ids = token_ids_of(load_prompts(prompts_path), checkpoint / "tokenizer.json")
    refs = compute(get_backend(backend_id).load_reference(checkpoint), token_ids, max_new_tokens)
    save(out, refs, max_new_tokens)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # KiB on Linux
    facts = ReferenceResult(prompts=len(refs), positions=sum(len(r.sequence) for r in refs),
                            top_k=int(refs[0].top_ids.shape[1]) if refs else 0, peak_rss_bytes=peak,
                            seconds=round(time.perf_counter() - started, 2))
    (out.parent / "reference.json").write_text(facts.model_dump_json(indent=2))
