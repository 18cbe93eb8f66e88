"""The Backend contract: everything relctl needs from a serving engine, and nothing it may assume beyond it.

A backend turns a merged Hugging Face checkpoint into the folder one serving engine loads (`export`), loads
that folder to validate it (`load`: encode, logits, greedy generate), serves it (`open_runner` for relctl's
own server, or `server_command` for an engine that is its own server process), and tells the rest of
relctl what it needs: which families and precisions it takes (`supports`, `precisions`), the files a
package must hold (`runtime_files`), the facts the memory plan reads (`memory_facts`), how the registry
logs it (`flavour`, `flavour_model`), its memory plan (`plan`: one `EnginePlan` per engine, read by the memory gate,
promote's memory stage and `relctl plan`), what a deployment runs (`deploy`, `deployment`: the device it was
validated on, image, args, env, memory) and its own `convert.<id>` settings (`settings_model`, checked at
config time). The pipeline, the gates, the server, the registry and deploy see only this contract and the
package manifest's `backend` entry, never an engine's files.

A backend is found through the `relctl.backends` entry-point group, built-ins included: a new engine is one
package with a `Backend` subclass and one entry point (see release/backends/__init__.py).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Protocol, runtime_checkable

from pydantic import BaseModel

from release.backends.planning import EnginePlan, Target
from release.core.errors import InputError

if TYPE_CHECKING:  # a backend module must import without starting anything
    import numpy as np  # an annotation only: reading release.yaml does not load numpy

    from release.backends.jobs import Job, ModelLimits
    from release.core.server_settings import ServerSettings


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


@dataclass(frozen=True)
class LogprobSupport:
    """What `relctl serve`'s /v1/completions returns beside text for this engine's packages, declared by the
    backend: `generated`: `logprobs` (each generated token's log-probability and its top-k alternatives);
    `prompt`: `echo` with `logprobs` (the prompt's tokens scored too, as lm-eval's log-likelihood tasks ask).
    Both come from the engine's own logits through its runner (a `ScoringRunner`). `why_not`: the reason a
    request for what it lacks is refused with (a 400 naming the backend and the field)."""

    generated: bool = False
    prompt: bool = False
    why_not: str = "its runner reports no log-probabilities"


class BatchProbe(Protocol):
    """One batched generation at a planned batch size and context, for measuring memory and cold start."""

    def run(self, batch: int, max_length: int, prompt: int, steps: int) -> float:
        """Prefill `batch` prompts of `prompt` tokens, decode `steps`; the seconds to the first token."""

    def close(self) -> None: ...


class BatchStats(Protocol):
    """A batching engine's counters, as relctl's server reports them (/health, metrics, its queue estimate)."""

    @property
    def steps(self) -> int: ...             # decode steps run

    @property
    def resident(self) -> int: ...          # sequences in the batch now

    @property
    def batched_tokens(self) -> int: ...    # tokens generated in batched steps

    @property
    def widest(self) -> int: ...            # the most tokens one step produced

    @property
    def services(self) -> Sequence[float]: ...  # recent requests' service times (s), for the queue estimate


class BatchEngine(Protocol):
    """An engine that batches admitted jobs itself (continuous batching); relctl's server admits up to
    `max_batch_size` jobs and submits them, instead of running each on a pool thread."""

    @property
    def max_batch_size(self) -> int: ...

    @property
    def healthy(self) -> bool: ...          # False after a failed step: later jobs go to the thread pool

    @property
    def stats(self) -> BatchStats: ...

    def submit(self, job: Job) -> None: ...

    def close(self) -> None: ...


class Runner(Protocol):
    """What relctl's own server drives: a loaded model's tokenizer and token loop. Admission, queueing,
    timeouts, stop strings and the HTTP protocol stay in release/serving and are the same for every backend.
    Its types (Job, ModelLimits, StopMatcher, ...) are release/backends/jobs.py: a plug-in imports nothing
    from release.serving."""

    limits: ModelLimits
    eos_ids: frozenset[int]
    batching_note: str

    @property
    def batch(self) -> BatchEngine | None:
        """The engine's own batching, or None: relctl's thread pool runs `decode_loop`, `workers` at once."""

    def encode(self, text: str) -> list[int]: ...

    def render_chat(self, messages: list[dict[str, str]]) -> str: ...

    def decode_loop(self, job: Job) -> tuple[str, int]:
        """Generate for one admitted job on a pool thread, emitting text; (finish reason, output tokens)."""

    def close(self) -> None: ...


class AdapterRunner(Runner, Protocol):
    """A runner that serves LoRA adapters beside its base (Backend.open_adapter_runner): a job whose
    `adapter` names a loaded one runs with it; load and unload happen while the base keeps serving."""

    def load_adapter(self, name: str, folder: Path) -> None:
        """Load the adapter built by `export_adapter` in `folder` under `name` (a new name: loads never replace)."""

    def unload_adapter(self, name: str) -> None: ...


@runtime_checkable
class ScoringRunner(Protocol):
    """A Runner whose backend declares `LogprobSupport`: for a job whose params ask for `logprobs`, its
    `decode_loop` fills `job.prompt_scores` (with `echo`) and `job.output_scores` from the engine's logits,
    and these turn its token ids back into text for the response."""

    def decode(self, ids: list[int]) -> str: ...

    def token_texts(self, ids: list[int]) -> list[str]:
        """Each token's own text (OpenAI's `tokens`; a byte-level token may be part of a character)."""


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
    """How register logs the model for MLflow: `kind` names an MLflow flavour (logged from the object
    `Backend.flavour_model` builds), or "files": the runtime files as artifacts of an MLflow model with this
    backend's metadata. `model_file` names the file the flavour loads, where it has one."""

    kind: str
    model_file: str = ""
    pip_requirements: tuple[str, ...] = ()


@dataclass(frozen=True)
class TensorInfo:
    """One input or output of a flavour's model signature: name, numpy dtype name, shape (-1: any size)."""

    name: str
    dtype: str
    shape: tuple[int, ...]


@dataclass(frozen=True)
class FlavourModel:
    """A model object for MLflow's own flavour `Flavour.kind` (the registry calls `mlflow.<kind>.log_model`
    with it as the first argument): the backend builds it, so the registry knows no engine's file format."""

    model: Any
    inputs: tuple[TensorInfo, ...]
    outputs: tuple[TensorInfo, ...]
    side_files: tuple[Path, ...] = ()       # model artifacts copied as they are (e.g. external weight data)
    log_options: dict[str, Any] = field(default_factory=dict)  # further keyword arguments of log_model


@dataclass(frozen=True)
class Deploy:
    """What `relctl render kserve` and `relctl init` write for this backend's packages."""

    image: str                       # the serving image the manifest runs
    dockerfile: str                  # the template it is built from (release/templates/)
    requirements: tuple[str, ...]    # what that image installs beside relctl
    kserve_template: str = "kserve-inferenceservice.yaml"  # its InferenceService (relctl init, render kserve):
                                     # a file of release/templates/, or a plug-in's own by absolute path


@dataclass(frozen=True)
class AdapterMount:
    """One pinned adapter version in a deployment: its package, pulled and verified by an init container
    (`relctl pull --sha256`) into `package_dir` in the pod before the server starts."""

    model: str         # its registered model: the name clients send as the OpenAI `model`
    version: str
    package_dir: str   # the verified package folder in the pod
    rank: int          # its LoRA rank (the package's adapter_config.json `r`)

    @property
    def folder(self) -> str:
        """The engine's adapter files: the package's model/ (release/core/package.py's layout)."""
        return f"{self.package_dir}/model"


@dataclass(frozen=True)
class Deployment:
    """How one released package runs in a KServe InferenceService on one device, as its backend decides from
    the package's own small config files (`deploy_files`) and the memory figures its release recorded."""

    validated_device: str                # the device it was built and validated for: "cpu", "cuda", "unknown"
    template: str                        # the InferenceService template (release/templates/, or an absolute path)
    runs_on: tuple[str, ...] = ("cpu", "cuda")  # devices it can run on at all (validated or not)
    own_engine: bool = False             # the engine's own image runs the container (not relctl serve's)
    engine_image: str | None = None      # that image's default for this device (None: the user names one)
    args: tuple[str, ...] = ()           # added to the container's args (unless the template sets them)
    env: dict[str, str] = field(default_factory=dict)  # added to the container's environment
    memory_bytes: int | None = None      # request and limit per replica: the plan plus measured overhead
    init_verifies: bool = False          # an init container verifies the package before the engine starts
                                         # (a ModelCar's files are then out of its reach)
    why_not: str = ""                    # why it cannot run on a device outside `runs_on`, in words


class PlanCheck(Protocol):
    """A judged number of a plan (the memory gate records it): what was measured against what bound."""

    name: str
    value: float
    op: str
    bound: float
    passed: bool


@dataclass(frozen=True)
class ExportResult:
    versions: dict[str, str]
    tokenizer_parity: bool | None = None
    notes: list[str] = field(default_factory=list)


class Backend(ABC):
    """One serving engine. Subclasses set the class attributes and implement the abstract methods."""

    id: ClassVar[str]
    display_name: ClassVar[str] = ""   # what a model card calls its packages (default: the id)
    # Where `convert.backend: auto` tries this backend among those that take a checkpoint: lower first, ties
    # by id. Declared, not the entry points' order (setuptools writes those by name, so a new plug-in would
    # otherwise jump ahead of the built-ins by spelling). Built-ins: onnxruntime-genai 10, vllm 20, llama-cpp 30.
    preference: ClassVar[int] = 100
    # The distribution whose version is recorded in a package's manifest (what built and serves it).
    distribution: ClassVar[str]
    precisions: ClassVar[tuple[str, ...]]
    execution_providers: ClassVar[tuple[str, ...]] = ("cpu",)
    # Files every package's model/ folder of this backend must hold (checked by verify, before loading).
    runtime_files: ClassVar[tuple[str, ...]]
    # Words for `relctl backends` and refusals: which families it takes.
    families: ClassVar[str] = ""
    # The package files (relative to the package root, JSON) a deployment is decided from; fetched and
    # verified against the manifest by `relctl render kserve` without downloading the weights.
    deploy_files: ClassVar[tuple[str, ...]] = ()
    # The `convert.<id>` block of release.yaml, checked at config time (None: the backend takes no settings).
    settings_model: ClassVar[type[BaseModel] | None] = None
    # The engine's own options of its memory plan (`gates.memory.engine.<id>`, `relctl plan --engine-option`),
    # checked at config time (None: it takes none).
    plan_settings: ClassVar[type[BaseModel] | None] = None
    # Whether a rolling update's new replica shares the old one's devices by default (relctl serve reloads
    # in place), or starts on its own devices (a surge: an engine that takes a device share up front).
    rollout_shares_devices: ClassVar[bool] = True
    # Whether the memory gate may time this engine's cold start by loading the folder in fresh relctl
    # processes (`load`); an engine that is its own server reports its start time through `plan` instead.
    cold_start_in_process: ClassVar[bool] = True
    # Whether validation's reference is the merged checkpoint itself (`load_reference(checkpoint)`, computed
    # once by the reference stage) rather than an fp32 build of this backend (`load_reference(build)`).
    reference_from_checkpoint: ClassVar[bool] = False
    # Which log-probabilities relctl serve returns for its packages (`logprobs`, `echo`); the default refuses
    # both with a 400 that says why.
    logprobs: ClassVar[LogprobSupport] = LogprobSupport()

    # -- what it takes ---------------------------------------------------------------------------
    @abstractmethod
    def supports(self, config: dict[str, Any]) -> Support:
        """Whether this checkpoint's family/config can be exported and served, from config.json alone."""

    def precisions_for(self, execution_provider: str) -> tuple[str, ...]:
        """The precisions this backend builds for `execution_provider` (what `relctl backends` lists)."""
        return tuple(p for p in self.precisions if self.target_problem(p, execution_provider, check_env=False) is None)

    def precision_variants(self, config: dict[str, Any], execution_provider: str) -> list[str]:
        """What `precision: auto` builds for this checkpoint here: each precision this device builds (widest
        first, as listed), plus any build option variants the backend offers (release/backends/variants.py).
        Default: the plain precisions."""
        return [p for p in self.precisions_for(execution_provider)
                if self.device_problem(config, p, execution_provider) is None]

    def device_problem(self, config: dict[str, Any], precision: str, execution_provider: str) -> str | None:
        """Why this checkpoint cannot be served at `precision` on `execution_provider` although the family is
        supported (a device-specific rule such as an attention kernel's head sizes), or None."""
        return None

    def target_problem(self, precision: str, execution_provider: str, check_env: bool = True) -> str | None:
        """Why this precision on this provider cannot be built, or None. Default: any listed pair works.
        `check_env`: also whether this machine can build it (an engine's environment is installed)."""
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

    def shape_export(self, out: Path, settings: BaseModel | None) -> list[str]:
        """Shape the folder `export` built in `out` by this engine's validated `convert.<id>` block (None when
        release.yaml gives none); notes for the convert summary. Default: the block shapes no build."""
        return []

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

    @abstractmethod
    def plan(self, source: Path, target: Target, precision: str | None = None,
             settings: dict[str, Any] | None = None, measure: bool = False,
             overlap_bytes: int | None = None) -> EnginePlan:
        """This engine's memory plan of `source` (a package folder, or a Hugging Face config.json planned
        before anything is built) on `target`. `settings`: the engine's own plan options (`plan_settings`;
        InputError naming an unknown one). `measure`: where the engine runs here as planned, check the plan
        against what the running engine reports (the checks go into the plan's `checks`). `overlap_bytes`:
        the replica being replaced when `target.rollout_overlap` (None: one like this)."""

    def plot_plan(self, plan: EnginePlan, out: Path) -> Path | None:
        """Draw the plan (memory against concurrency) to `out` (PNG); None: this engine draws none."""
        return None

    def plan_lines(self, plan: EnginePlan) -> list[str]:
        """The plan as `relctl plan` prints it: its figures, then the verdict. Default: the contract's figures."""
        t = plan.target
        rows = [("weights", plan.weights_bytes), ("KV cache", plan.kv_cache_bytes),
                ("activations", plan.activations_bytes), ("overhead", plan.overhead_bytes),
                ("one replica", plan.per_replica_bytes), ("peak", plan.peak_bytes), ("budget", plan.budget_bytes),
                ("capacity", plan.capacity_bytes)]
        lines = [f"{self.id}: {plan.precision}, {t.concurrency} x {t.context:,} tokens on {t.gpus} x "
                 f"{t.gpu_name or f'{t.memory_gib:g} GiB'}; KV {plan.kv_bytes_per_token:,} bytes/token"]
        lines += [f"  {label:16s}{value / 1024**3:9.3f} GiB" for label, value in rows]
        return [*lines, ("✓ " if plan.fits else "✗ ") + plan.summary]

    def check_environment(self, model_dir: Path | None = None, device: str = "cpu") -> None:  # noqa: B027
        """InputError when this machine's environment would measure the wrong engine (two builds of a runtime
        installed over each other; `device` asked for but a session would silently run elsewhere); called
        before timing or measuring. Default: nothing to check."""

    def configure(self, settings: BaseModel, base_dir: Path, label: str) -> None:  # noqa: B027 - optional hook
        """Apply the validated `convert.<id>` block (paths relative to release.yaml's folder `base_dir`).
        Called once per load of release.yaml; default: nothing to apply."""

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

    # -- adapters (docs/adapters.md) ------------------------------------------------------------------
    def adapter_problem(self, precision: str) -> str | None:
        """Why this engine cannot serve a LoRA adapter beside a base it built at `precision` without merging it
        (one line, for the refusal, asked before any download); None: it can (`export_adapter`,
        `load_with_adapter`, `open_adapter_runner`)."""
        return f"{self.id} serves merged releases only (no LoRA adapters beside a running base)"

    def export_adapter(self, adapter_dir: Path, model_dir: Path, out: Path) -> None:
        """Write into `out` what this engine loads for the PEFT adapter in `adapter_dir` on the base built in
        `model_dir` (its precision and layout); InputError for an adapter it cannot serve."""
        raise InputError(f"{self.id} serves merged releases only (no LoRA adapters beside a running base)",
                         hint="release the run merged: relctl promote RUN (without --onto)")

    def load_with_adapter(self, model_dir: Path, adapter_dir: Path) -> LoadedModel:
        """The base in `model_dir` with the exported adapter in `adapter_dir` active, as this engine serves
        them together: what an adapter release validates against the merged reference."""
        raise InputError(f"{self.id} cannot load LoRA adapters")

    def open_adapter_runner(self, model_dir: Path, settings: ServerSettings,
                            adapters: Mapping[str, Path]) -> AdapterRunner:
        """`open_runner` with adapter serving on and `adapters` (name: exported folder) loaded."""
        raise InputError(f"{self.id} cannot serve LoRA adapters")

    def adapter_deploy_args(self, adapters: Sequence[AdapterMount]) -> list[str]:
        """The serving container's args that serve `adapters` (each under its registered model's name) from
        its start, as open_adapter_runner starts them: what a deployment manifest adds to the base's."""
        raise InputError(f"{self.id} cannot serve LoRA adapters", hint="render the base alone (without --adapters)")

    # -- registry and deployment -------------------------------------------------------------------
    def flavour(self) -> Flavour:
        return Flavour("files")

    def flavour_model(self, model_dir: Path) -> FlavourModel | None:
        """The model object MLflow's `flavour().kind` flavour logs (None for kind "files": the registry logs
        the runtime files under relctl's own flavour). Must not load the weights: registering costs a copy."""
        return None

    @abstractmethod
    def deploy(self) -> Deploy: ...

    def deployment(self, files: dict[str, dict[str, Any]], memory: dict[str, float],
                   device: str | None = None) -> Deployment:
        """How a package of this backend runs in KServe on `device` ("cpu", "cuda"; None: the one it was
        validated on), from its `deploy_files` (as read from the released package, by path) and the `memory.*`
        figures its release recorded (without the prefix). Default: relctl serve's image, validated device
        unknown (nothing refused), memory from the plan."""
        per_replica = memory.get("per_replica_bytes")
        return Deployment(validated_device="unknown", template="kserve-inferenceservice.yaml",
                          memory_bytes=int(per_replica) if per_replica else None)

    def describe(self) -> str:
        """One line for `relctl backends` and refusals: id, the precisions per provider, families."""
        offered = "; ".join(f"{', '.join(self.precisions_for(p))} on {p}" for p in self.execution_providers
                            if self.precisions_for(p))
        options = f"; plan options: {', '.join(self.plan_settings.model_fields)}" if self.plan_settings else ""
        return f"{self.id} {self.version()}: {offered}; {self.families or 'see its documentation'}{options}"


def precision_choices(backends: Sequence[Backend]) -> list[str]:
    """Every precision some installed backend builds, in a stable order."""
    seen: list[str] = []
    for backend in backends:
        seen += [p for p in backend.precisions if p not in seen]
    return seen
