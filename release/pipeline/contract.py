"""The run contract: what a training run must log for relctl to release it, checked in seconds.

`relctl check RUN` and the first step of `relctl promote` read only the run's artifact listing, its tags
and the checkpoint's config.json (the one file downloaded: it decides which backend can build and serve the
family, so an unsupported one is refused here, in seconds), resolve every gate's configuration, and list
every problem at once, each with its fix. Required:
    checkpoint/                 (source.artifact_path) Hugging Face layout: config.json, *.safetensors
                                (+ model.safetensors.index.json when sharded), tokenizer.json; optional
                                PEFT adapter: adapter_config.json + adapter_model.safetensors
    validation/prompts.jsonl    {"prompt": ...} per line (or validation.prompts in release.yaml)
    data/eval.jsonl             {"prompt", "expected"} per line, when the eval gate runs without gates.eval.dataset
Recommended (a warning when missing): the git commit tag `mlflow.source.git.commit`, data digests
`data.<name>.sha256` (the lineage a regression is traced with).
"""

from __future__ import annotations

import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from release.backends import AUTO, Backend, available_backends, choose_backend, family_of
from release.backends.families import check_supported
from release.config import ReleaseConfig
from release.core.checkpoint import PICKLE_SUFFIXES
from release.core.errors import InputError, InputProblems, ReleaseError
from release.core.jsonfile import load_json
from release.core.model_name import bad_model_name
from release.gating.contract import Gate, Problem, data_warnings, missing_file, preflight, wants_data
from release.lora.base_name import BASE_NAME_HINT, check_base_names
from release.pipeline.contexts import context_problems
from release.pipeline.engines import engine_problems
from release.pipeline.precision_search import checked_config, search_problems
from release.registry import PRODUCTION, Registry
from release.registry import tags as T
from release.registry.kinds import ADAPTER, MERGED, name_problem
from release.registry.records import RunRecord
from release.signing.keys import signing_problem
from release.stages.intake import EVAL_ARTIFACT, PROMPTS_ARTIFACT


@dataclass
class ContractReport:
    run_id: str
    run: RunRecord | None = None            # the training run as read for the check (promote goes on with it)
    problems: list[Problem] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    found: dict[str, bool] = field(default_factory=dict)
    backend: Backend | None = None    # the backend that will build and serve the checkpoint, once known
    engine_why: str | None = None     # why that backend: release.yaml named it, or what auto passed over
    model: str | None = None          # the registered model name the release would use, once it is valid
    needs: dict[str, Any] | None = None  # the memory and disk the release will need (release/pipeline/resources.py)
    bounds: list[str] = field(default_factory=list)  # how long a gate may take, stated (a load sweep's cap)


# MLflow's "Default" experiment always has id "0" (any store, SQL or file).
DEFAULT_EXPERIMENT_ID = "0"


def config_problems(cfg: ReleaseConfig) -> list[Problem]:
    """What is wrong with release.yaml beyond its schema: the same list for `relctl check` and `promote`."""
    missing = [g for g in cfg.require if g not in cfg.gates]
    if not missing:
        return []
    return [Problem(f"release.yaml: require lists {', '.join(missing)}, which gates: does not configure",
                    f"add a gates.{missing[0]} block, or remove it from require")]


def release_model_name(registry: Registry, cfg: ReleaseConfig, run: RunRecord) -> tuple[str | None, Problem | None]:
    """The registered model name a release of `run` uses (release.yaml `model:`, else the run's experiment
    name), or the problem with it. release.yaml's own value was checked when it was loaded."""
    if cfg.model is not None:
        return cfg.model, None
    name = registry.experiment_name(run.experiment_id)
    if run.experiment_id == DEFAULT_EXPERIMENT_ID:
        # MLflow's fallback experiment: its name says nothing about the model, and every run logged without
        # set_experiment() lands there, so releases of unrelated models would all become versions of "Default".
        return None, Problem(f"run '{run.run_id}' was logged without an experiment (MLflow's '{name}'), so "
                             f"its release would register a model named '{name}'",
                             "set model: in release.yaml (or pass --model), or log the run under a named "
                             "experiment: mlflow.set_experiment('my-model') before mlflow.start_run()")
    why = bad_model_name(name)
    if why is None:
        return name, None
    return None, Problem(f"the run's experiment name is no model name: {why}",
                         "set model: in release.yaml (or pass --model) to name the registered model")


def engine_reason(config: dict[str, Any], cfg: ReleaseConfig, chosen: Backend) -> str:
    """Why `chosen` builds and serves this checkpoint, in one sentence for the progress line and the card: an
    engine change must never be silent (an OLMo checkpoint that auto sent to another engine said only "via ENGINE")."""
    target = f"{cfg.convert.precision} on {cfg.convert.execution_provider}"
    if cfg.convert.backend != AUTO:
        return f"convert.backend: {chosen.id} in release.yaml"
    if cfg.engines:
        return "convert.backend: auto with engines: the engines comparison chooses the cheapest that qualifies"
    passed = []
    for backend in available_backends().values():
        if backend.id == chosen.id:
            break
        support = backend.supports(config)
        problem = support.reason if not support.supported else backend.target_problem(
            cfg.convert.precision, cfg.convert.execution_provider)
        passed.append(f"{backend.id}: {problem}")
    why = f"convert.backend: auto took the first installed backend that builds {family_of(config)} at {target}"
    return why + (f", passing over {'; '.join(passed)}" if passed else "")


def check_run(registry: Registry, run_id: str, cfg: ReleaseConfig, gates: list[Gate],
              config_dir: Path | None) -> ContractReport:
    """Every problem with `run_id` and the release configuration, without downloading anything."""
    report = ContractReport(run_id, problems=config_problems(cfg))
    run = report.run = registry.get_run(run_id)  # a missing run is its own, single error
    adapter = cfg.release.mode == "adapter"
    if adapter:  # release.mode adapter: the base by content, from tags (seconds); the engine is the base's
        from release.adapters.policy import unsupported  # noqa: PLC0415 - adapter releases only

        said = {p.message for p in report.problems}  # config_problems' `require` line is the same line
        report.problems += [Problem(message, hint) for message, hint in unsupported(cfg) if message not in said]
        report.model = adapter_problems(registry, run, cfg, report)
    else:
        report.model, bad_name = release_model_name(registry, cfg, run)
        if bad_name is not None:
            report.problems.append(bad_name)
        elif report.model is not None:
            report.problems += stranding_problems(registry, cfg, report.model)
    if report.model is not None:  # a name holds whole models or adapters, never both (registry/kinds.py)
        wrong_kind = name_problem(registry, report.model, ADAPTER if adapter else MERGED)
        if wrong_kind is not None:
            report.problems.append(Problem(*wrong_kind))
    ckpt = cfg.source.artifact_path
    files = {p.rsplit("/", 1)[-1] for p in registry.list_artifacts(run_id, ckpt, run)}
    report.found["checkpoint"] = bool(files)

    def need(ok: bool, message: str, hint: str) -> None:
        if not ok:
            report.problems.append(Problem(message, hint))

    has_adapter = "adapter_config.json" in files  # a PEFT adapter logged beside the base weights
    if "config.json" in files:
        try:
            config = read_run_config(registry, run_id, ckpt)
            if not adapter:  # an adapter builds no model: its engine, precision and memory are the base's
                report.problems += search_problems(cfg, gates)  # precision: auto needs margins and a price
                cfg = checked_config(cfg, config)  # precision: auto: its widest build and every variant
                report.backend = choose_backend(config, cfg.convert.backend, cfg.convert.precision,
                                                cfg.convert.execution_provider)
                report.engine_why = engine_reason(config, cfg, report.backend)
                report.problems += engine_problems(cfg, config, gates)  # engines: each must build this family
                report.problems += context_problems(cfg, gates, config)  # every context within the model's
                report.problems += resource_problems(config, cfg, config_dir, report, has_adapter)  # before stages
                # Promote's memory stage plans the architecture: one it cannot plan is refused now, not after convert.
                check_supported(config, f"{ckpt}/config.json")
                if has_adapter:
                    check_adapter_base(registry, run_id, ckpt, config, report)
        except InputError as exc:
            need(False, exc.message if exc.message.startswith(ckpt) else f"{ckpt}/{exc.message}", exc.hint or "")
    if not files:
        need(False, f"run '{run_id}' has no checkpoint at artifact path '{ckpt}/'",
             f"log it with mlflow.log_artifacts(checkpoint_dir, '{ckpt}') or set source.artifact_path")
    else:
        need("config.json" in files, f"{ckpt}/config.json is missing",
             "log the model's config.json beside its weights (model.config.save_pretrained(dir))")
        weights = [f for f in files if f.endswith(".safetensors") and f != "adapter_model.safetensors"]
        pickles = sorted(f for f in files if f.endswith(PICKLE_SUFFIXES))
        need(not pickles, f"{ckpt}/: pickle checkpoint files are not accepted ({', '.join(pickles[:3])})",
             "save with safetensors (save_pretrained(..., safe_serialization=True)); relctl never unpickles")
        need(bool(weights), f"{ckpt}/: no *.safetensors weights", "log the weights in Hugging Face layout")
        need("tokenizer.json" in files, f"{ckpt}/tokenizer.json is missing",
             "save the training tokenizer beside the weights (tokenizer.save_pretrained(dir))")
        need(not adapter or has_adapter, f"{ckpt}/ holds no LoRA adapter (adapter_config.json), "
             "and release.mode adapter releases one", "log the PEFT adapter with the run, or set release.mode: merged")
        if has_adapter:
            need("adapter_model.safetensors" in files, f"{ckpt}/adapter_config.json has no adapter_model.safetensors",
                 "save the adapter with save_pretrained(..., safe_serialization=True)")
    listed = {p for folder in ("validation", "data") for p in registry.list_artifacts(run_id, folder, run)}
    report.found["prompts"] = PROMPTS_ARTIFACT in listed
    if cfg.validation.prompts is None:
        need(PROMPTS_ARTIFACT in listed, f"run '{run_id}' has no validation prompts ({PROMPTS_ARTIFACT})",
             "log validation/prompts.jsonl with the run or set validation.prompts in release.yaml")
    else:
        found = missing_file("validation.prompts", cfg.validation.prompts, config_dir)
        if found:
            report.problems.append(found)
    report.found["eval_data"] = EVAL_ARTIFACT in listed
    eval_gate = next((g for g in gates if g.id == "eval"), None)
    if eval_gate is not None and getattr(getattr(eval_gate, "config", None), "dataset", "") is None:
        need(EVAL_ARTIFACT in listed, f"the eval gate needs an eval set: run '{run_id}' has no {EVAL_ARTIFACT}",
             "log data/eval.jsonl with the run or set gates.eval.dataset in release.yaml")
    report.problems += [p for gate in gates for p in preflight(gate, config_dir)]
    report.bounds += [line for gate in gates for line in getattr(gate, "bounds", list)()]
    report.warnings += gate_data_warnings(registry, run_id, gates, config_dir, report.found["eval_data"])
    key_problem = signing_problem(cfg.signing, config_dir or Path.cwd())  # a bad key fails here, not at register
    if key_problem is not None:
        report.problems.append(Problem(*key_problem))
    tags = run.tags
    if T.TRAINING_GIT_COMMIT not in tags:
        report.warnings.append(f"run '{run_id}' has no {T.TRAINING_GIT_COMMIT} tag: the release cannot be "
                               "traced to its code (log from a git checkout, or set the tag)")
    if not any(k.startswith("data.") and k.endswith(".sha256") for k in tags):
        report.warnings.append(f"run '{run_id}' records no data digests (data.<name>.sha256): the release "
                               "cannot be traced to its data")
    return report



def gate_data_warnings(registry: Registry, run_id: str, gates: list[Gate], config_dir: Path | None,
                       run_has_eval_set: bool) -> list[str]:
    """What the gates find likely wrong in the data they will read (their `warnings` hook), e.g. expected
    strings that already start with the eval gate's separator. The run's eval set is downloaded for them
    (one small file) only when a gate reads data for warnings."""
    readers = [gate for gate in gates if wants_data(gate)]
    if not readers:
        return []
    with tempfile.TemporaryDirectory(prefix="relctl-eval-") as tmp:
        try:
            eval_set = registry.download_run_artifact(run_id, EVAL_ARTIFACT, Path(tmp)) if run_has_eval_set else None
        except ReleaseError:
            eval_set = None  # intake downloads it again and says what is wrong; a warning is no place for it
        return [warning for gate in readers for warning in data_warnings(gate, config_dir, eval_set)]


def adapter_problems(registry: Registry, run: RunRecord, cfg: ReleaseConfig, report: ContractReport) -> str | None:
    """release.mode adapter: the base `release.onto` names, proven by content digest (tags only, as promote
    does first); the adapter's registered model name, or None when the base cannot be read."""
    from release.adapters.base_match import match_base  # noqa: PLC0415 - adapter releases only
    from release.adapters.release import adapter_model_name  # noqa: PLC0415 - as above
    from release.adapters.target import parse_target  # noqa: PLC0415 - as above

    assert cfg.release.onto is not None  # the schema requires it in adapter mode
    try:
        match = match_base(registry, run.run_id, parse_target(cfg.release.onto))
        report.found["base"] = True  # the run trained on the weights the target version serves, or logged no digest
        if not match.proven:
            report.warnings.append(
                f"run '{run.run_id}' logged no base digest ({T.TRAINING_BASE_SHA256}): promote computes it from "
                f"the checkpoint's base weights at intake and refuses a base other than {match.where}'s there, "
                "after the download (log it with `relctl digest CHECKPOINT_DIR` to be refused in seconds)")
        return adapter_model_name(cfg.model, match.model, registry.experiment_name(run.experiment_id))
    except InputError as exc:
        report.found["base"] = False
        report.problems.append(Problem(exc.message, exc.hint or ""))
        return None


def stranding_problems(registry: Registry, cfg: ReleaseConfig, model: str) -> list[Problem]:
    """A merged release of `model` moves its production (now, or after its canary or approval): the production
    adapters built for today's production version would then serve on no production base. Refused, naming
    them, unless release.yaml's `release.strand_adapters` (or promote --strand-adapters) says to go on."""
    if cfg.release.strand_adapters or not registry.model_exists(model):
        return []
    production = registry.version_for(model, PRODUCTION)
    if production is None:
        return []
    from release.adapters.trust import production_adapters  # noqa: PLC0415 - one tag search: adapters only

    stranded = production_adapters(registry, model, str(production.version))
    if not stranded:
        return []
    named = ", ".join(f"{name} v{mv.version}" for name, mv in sorted(stranded.items()))
    return [Problem(f"{model}: this release would move production off v{production.version}, stranding the "
                    f"production adapters built for it: {named}",
                    f"pass --strand-adapters (or set release.strand_adapters: true in release.yaml) to release "
                    f"anyway, then release each adapter onto the new version (relctl promote RUN --onto "
                    f"{model}@production); servers running v{production.version} keep serving them")]


def resource_problems(config: dict[str, Any], cfg: ReleaseConfig, config_dir: Path | None,
                      report: ContractReport, merges_adapter: bool) -> list[Problem]:
    """The release's memory and disk against this machine's (release/pipeline/resources.py)."""
    from release.pipeline import resources  # noqa: PLC0415 - the memory shape rules load only here

    need = resources.needs(config, cfg.convert.precision, cfg.convert.execution_provider, merges_adapter)
    if need is None:
        return []
    report.needs = need.as_dict()
    return [Problem(message, hint) for message, hint in
            resources.shortfalls(need, resources.machine(config_dir or Path.cwd()))]


def require_contract(registry: Registry, run_id: str, cfg: ReleaseConfig, gates: list[Gate], config_dir: Path | None,
                     note: Callable[[str], None]) -> ContractReport:
    """check_run for promote: the warnings through `note`, once and before any error; every problem raised at
    once (InputProblems, exit 2). Run before the pipeline is even imported, so a refused run is refused fast."""
    contract = check_run(registry, run_id, cfg, gates, config_dir)
    for warning in contract.warnings:
        note(warning)
    if contract.problems or contract.model is None:
        raise InputProblems([(p.message, p.hint) for p in contract.problems])
    return contract


def read_run_config(registry: Registry, run_id: str, ckpt: str) -> dict[str, Any]:
    """The checkpoint's config.json, downloaded alone (kilobytes) into a temporary folder."""
    with tempfile.TemporaryDirectory(prefix="relctl-config-") as tmp:
        path = registry.download_run_artifact(run_id, f"{ckpt}/config.json", Path(tmp))
        data = load_json(path, "log the config.json that model.config.save_pretrained(dir) writes")
    if not isinstance(data, dict):
        raise InputError("config.json: top level is not an object",
                         hint="log the config.json that model.config.save_pretrained(dir) writes")
    return data


def check_adapter_base(registry: Registry, run_id: str, ckpt: str, config: dict[str, Any],
                       report: ContractReport) -> None:
    """An adapter recorded for another base than the run's is refused naming both (a warning when either
    side records no name)."""
    with tempfile.TemporaryDirectory(prefix="relctl-adapter-") as tmp:
        path = registry.download_run_artifact(run_id, f"{ckpt}/adapter_config.json", Path(tmp))
        try:
            adapter = load_json(path, "save the adapter with save_pretrained()")
        except InputError:
            adapter = None
    if not isinstance(adapter, dict):
        report.problems.append(Problem(f"{ckpt}/adapter_config.json is not a JSON object",
                                       "save the adapter with save_pretrained()"))
        return
    check = check_base_names(adapter, config)
    if check.error:
        report.problems.append(Problem(f"{ckpt}/{check.error}", BASE_NAME_HINT))
    elif check.warning:
        report.warnings.append(check.warning)
