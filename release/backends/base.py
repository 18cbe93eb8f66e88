"""The Backend contract: everything relctl needs from a serving engine, and nothing it may assume beyond it.

A backend turns a merged Hugging Face checkpoint into the folder one serving engine loads (`export`), loads
that folder to validate it (`load`: encode, logits, greedy generate), serves it (`open_runner` for relctl's
own server, or `server_command` for an engine that is its own server process), and tells the rest of
relctl what it needs: which families and precisions it takes (`supports`, `precisions`), the files a
package must hold (`runtime_files`), the facts the memory plan reads (`memory_facts`), how the registry
logs it (`flavour`) and what a deployment runs (`deploy`). The pipeline, the gates, the server and the
registry see only this contract and the package manifest's `backend` entry, never an engine's files.

A backend is found through the `relctl.backends` entry-point group, built-ins included: a new engine is one
package with a `Backend` subclass and one entry point (see release/backends/__init__.py).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass, field
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Literal, Protocol

import numpy as np

if TYPE_CHECKING:  # the server's types; a backend module must import without starting anything
    from release.core.server_settings import ServerSettings
    from release.serving.jobs import Job
    from release.serving.protocol import ModelLimits


@dataclass(frozen=True)
class Support:
    """Whether a backend takes a checkpoint, decided from its config.json alone (seconds, no weights read)."""

    supported: bool
    reason: str = ""      # why not, in words a user can act on
    family: str = ""      # the architecture / model_type it was judged on

    @classmethod
    def yes(cls, family: str) -> Support:
        return cls(True, "", family)

    @classmethod
    def no(cls, family: str, reason: str) -> Support:
        return cls(False, reason, family)


def architecture(config: dict[str, Any]) -> str:
    """The checkpoint's architecture class as config.json names it (`architectures[0]`), or ""."""
    architectures = config.get("architectures") or []
    return str(architectures[0]) if isinstance(architectures, list) and architectures else ""


def unnamed_architecture(config: dict[str, Any]) -> Support:
    """The refusal of a config.json that names no architecture: no backend can tell what to build."""
    return Support.no(str(config.get("model_type") or "unknown"),
                      "config.json has no 'architectures' entry (save it with model.save_pretrained())")


@dataclass(frozen=True)
class Generation:
    """One greedy completion. `token_ids` are the generated tokens only (EOS included when hit)."""

    text: str
    token_ids: list[int]
    prompt_tokens: int
    finish_reason: str  # "stop" (EOS) or "length"


class LoadedModel(Protocol):
    """A package's model loaded by its own engine, for validation and the offline gates. Thread-safe."""

    model_dir: Path

    @property
    def context_length(self) -> int: ...

    @property
    def eos_token_ids(self) -> list[int]: ...

    def encode(self, text: str) -> list[int]:
        """Token ids exactly as the served model sees `text` (special tokens such as BOS included)."""

    def decode(self, ids: list[int]) -> str: ...

    def generate(self, prompt: str, max_new_tokens: int) -> Generation: ...

    def generate_ids(self, input_ids: list[int], max_new_tokens: int) -> list[int]:
        """Greedy continuation of already-tokenized input."""

    def logits(self, ids: list[int]) -> np.ndarray:
        """Teacher-forced logits for `ids`, shape (len(ids), vocab), float32. Log-probabilities qualify (a
        per-row constant changes no softmax); an engine that returns only the top-k log-probabilities per
        position fills the rest with the remaining mass spread evenly (release/backends/vllm/model.py)."""


class BatchProbe(Protocol):
    """One batched generation at a planned batch size and context, for measuring memory and cold start."""

    def run(self, batch: int, max_length: int, prompt: int, steps: int) -> float:
        """Prefill `batch` prompts of `prompt` tokens, decode `steps`; the seconds to the first token."""

    def close(self) -> None: ...


class Runner(Protocol):
    """What relctl's own server drives: a loaded model's tokenizer and token loop. Admission, queueing,
    timeouts, stop strings and the HTTP protocol stay in release/serving and are the same for every backend."""

    limits: ModelLimits
    eos_ids: frozenset[int]
    batch: Any            # a batching engine with submit/close/stats, or None (the thread pool serves)
    batching_note: str

    def encode(self, text: str) -> list[int]: ...

    def render_chat(self, messages: list[dict[str, str]]) -> str: ...

    def decode_loop(self, job: Job) -> tuple[str, int]:
        """Generate for one admitted job on a pool thread, emitting text; (finish reason, output tokens)."""

    def close(self) -> None: ...


@dataclass(frozen=True)
class ServerCommand:
    """An engine that is its own OpenAI-compatible server: the command, its environment and readiness URL."""

    argv: list[str]
    env: dict[str, str] = field(default_factory=dict)
    health_path: str = "/health"


@dataclass(frozen=True)
class MemoryFacts:
    """What the memory plan reads from a built folder, measured from its files, never assumed."""

    weights_bytes: int
    kv_dtype_bytes: int
    precision: str
    provider: str


@dataclass(frozen=True)
class EngineMemory:
    """What an engine serving a folder reports about its own memory (vLLM: its start-up KV cache line), for the
    memory gate to hold the plan against."""

    kv_cache_tokens: int
    max_concurrency: float
    max_model_len: int
    log_line: str
    start_s: float           # how long the engine took to become ready (its cold start, load included)
    kv_cache_bytes: int | None = None  # the explicit KV pool it was started with, if any
    resident_bytes: int | None = None  # host memory its processes hold now (RSS), where measurable


@dataclass(frozen=True)
class Flavour:
    """How register logs the model for MLflow. `onnx`: an MLflow ONNX model (`model_file` is the graph);
    `files`: the runtime files as artifacts of an MLflow model with this backend's metadata."""

    kind: Literal["onnx", "files"]
    model_file: str = ""
    pip_requirements: tuple[str, ...] = ()


@dataclass(frozen=True)
class Deploy:
    """What `relctl render kserve` and `relctl init` write for this backend's packages."""

    image: str                       # the serving image the manifest runs
    dockerfile: str                  # the template it is built from (release/templates/)
    requirements: tuple[str, ...]    # what that image installs beside relctl


@dataclass(frozen=True)
class ExportResult:
    versions: dict[str, str]
    tokenizer_parity: bool | None = None
    notes: list[str] = field(default_factory=list)


class Backend(ABC):
    """One serving engine. Subclasses set the class attributes and implement the abstract methods."""

    id: ClassVar[str]
    # The distribution whose version is recorded in a package's manifest (what built and serves it).
    distribution: ClassVar[str]
    precisions: ClassVar[tuple[str, ...]]
    execution_providers: ClassVar[tuple[str, ...]] = ("cpu",)
    # Files every package's model/ folder of this backend must hold (checked by verify, before loading).
    runtime_files: ClassVar[tuple[str, ...]]
    # Words for `relctl backends` and refusals: which families it takes.
    families: ClassVar[str] = ""
    # Whether validation's reference is the merged checkpoint itself (`load_reference(checkpoint)`, computed
    # once by the reference stage) rather than an fp32 build of this backend (`load_reference(build)`).
    reference_from_checkpoint: ClassVar[bool] = False

    # -- what it takes ---------------------------------------------------------------------------
    @abstractmethod
    def supports(self, config: dict[str, Any]) -> Support:
        """Whether this checkpoint's family/config can be exported and served, from config.json alone."""

    def target_problem(self, precision: str, execution_provider: str) -> str | None:
        """Why this precision on this provider cannot be built, or None. Default: any listed pair works."""
        if precision not in self.precisions:
            return f"precision {precision} is not one of {', '.join(self.precisions)}"
        if execution_provider not in self.execution_providers:
            return f"execution provider {execution_provider} is not one of {', '.join(self.execution_providers)}"
        return None

    def recognizes(self, model_dir: Path) -> bool:
        """Whether a built folder without a manifest is this backend's (default: all its runtime files)."""
        return all((model_dir / name).is_file() for name in self.runtime_files)

    def version(self) -> str:
        try:
            return version(self.distribution)
        except PackageNotFoundError:
            return "not installed"

    # -- building and loading --------------------------------------------------------------------
    @abstractmethod
    def export(self, checkpoint: Path, out: Path, precision: str, execution_provider: str,
               log_path: Path) -> ExportResult:
        """Build the folder this engine serves from the merged `checkpoint` into `out` (which exists, empty)."""

    @abstractmethod
    def load(self, model_dir: Path, execution_provider: str = "cpu") -> LoadedModel:
        """Load a built folder for validation and the offline gates."""

    def load_reference(self, model_dir: Path) -> LoadedModel:
        """The reference validation compares the candidate with: given the fp32 reference build (default:
        `load` it), or the merged checkpoint when `reference_from_checkpoint` (then typically
        release.backends.torch_reference.TorchReference). A backend whose engine runs out of process may
        compute it in relctl's environment instead."""
        return self.load(model_dir)

    def runtime_config(self, model_dir: Path) -> dict[str, Any]:
        """The engine's own config in a built folder, hashed into the serving config hash (default: none)."""
        return {}

    @abstractmethod
    def memory_facts(self, model_dir: Path, declared_precision: str | None) -> MemoryFacts: ...

    def engine_memory(self, model_dir: Path) -> EngineMemory | None:
        """What the engine reports about its memory serving `model_dir` (starting it if need be); None: this
        engine reports nothing the plan can be checked against (onnxruntime-genai is measured instead)."""
        return None

    def batch_probe(self, model_dir: Path, provider: str) -> BatchProbe | None:
        """A loaded model that runs one batch for the memory measurement; None: this engine cannot be measured
        in-process (the plan's estimate is then the only memory evidence)."""
        return None

    # -- serving -----------------------------------------------------------------------------------
    @abstractmethod
    def open_runner(self, model_dir: Path, settings: ServerSettings) -> Runner:
        """The model as relctl's own server drives it (an engine that is its own process, like vLLM, returns a
        runner that forwards each admitted request to it, so admission, auth and headers stay relctl's)."""

    def server_command(self, model_dir: Path, served_name: str, host: str, port: int,
                       settings: ServerSettings) -> ServerCommand | None:
        """An engine that is its own server process; None: relctl's server runs `open_runner`."""
        return None

    def admission_limit(self, settings: ServerSettings) -> int | None:
        """How many requests the engine schedules at once by itself (vLLM's max_num_seqs). relctl's server then
        admits at least that many into it, so its queue never caps the engine below its own scheduler (an
        engines table would otherwise rank relctl's queue). None: relctl schedules; `serving.server.workers`."""
        return None

    # -- registry and deployment -------------------------------------------------------------------
    def flavour(self) -> Flavour:
        return Flavour("files")

    @abstractmethod
    def deploy(self) -> Deploy: ...

    def describe(self) -> str:
        """One line for `relctl backends` and refusals: id, precisions, providers, families."""
        return (f"{self.id} {self.version()}: precisions {', '.join(self.precisions)} on "
                f"{', '.join(self.execution_providers)}; {self.families or 'see its documentation'}")


def precision_choices(backends: Sequence[Backend]) -> list[str]:
    """Every precision some installed backend builds, in a stable order."""
    seen: list[str] = []
    for backend in backends:
        seen += [p for p in backend.precisions if p not in seen]
    return seen
