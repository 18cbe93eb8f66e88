"""`relctl init [DIR]`: a starter project — release.yaml from the schema, the promote workflow, deployment.

Files come from relctl's own templates (package data, so this works from an installed wheel); nothing is
overwritten without --force, and a refusal writes nothing.
"""

from __future__ import annotations

import json
import os
import shlex
import tempfile
from dataclasses import dataclass, field
from importlib.metadata import PackageNotFoundError, distribution
from pathlib import Path

from release.core.errors import InputError
from release.core.escape import yaml_scalar
from release.core.templates import template_text

DEFAULT_KSERVE_TEMPLATE = "kserve-inferenceservice.yaml"  # relctl serve's; a backend may name its own

GITIGNORE_LINE = ".relctl/"
# The line of templates/github-promote.yml that `init` fills in when it knows where relctl came from.
SOURCE_LINE = '  RELCTL_SOURCE: ""'

# Destination in the new project -> template file name.
STARTER_FILES: dict[str, str] = {
    ".github/workflows/promote.yml": "github-promote.yml",
    "deploy/kserve-inferenceservice.yaml": "kserve-inferenceservice.yaml",
    "deploy/Dockerfile": "Dockerfile",
    "deploy/Dockerfile.cuda": "Dockerfile.cuda",
}


@dataclass
class InitResult:
    """What `init` did: files written (relative to the project), and whether .gitignore was touched."""

    project_dir: str
    written: list[str] = field(default_factory=list)
    gitignore: str = "unchanged"
    relctl_source: str | None = None
    # The line to run in a shell so that runs logged with MLflow land where relctl reads them.
    tracking_export: str = ""
    release_key: str | None = None   # the fingerprint of the key pair init made (None: the project had one)


def relctl_source() -> str | None:
    """Where this relctl was installed from, as a pip direct reference CI can reuse (PEP 610), or None.

    A git checkout gives `git+URL@COMMIT`, a wheel downloaded from a URL gives that URL; a local path or an
    editable install cannot be reached from a CI runner, so it gives None.
    """
    try:
        raw = distribution("relctl").read_text("direct_url.json")
    except PackageNotFoundError:
        return None
    if not raw:
        return None
    info = json.loads(raw)
    url = str(info.get("url", ""))
    if not url.startswith(("https://", "http://")) or info.get("dir_info"):
        return None
    vcs = info.get("vcs_info")
    if vcs:
        return f"{vcs['vcs']}+{url}@{vcs['commit_id']}"
    return url


def starter_texts(source: str | None) -> dict[str, str]:
    """Every file `init` writes except .gitignore, by path relative to the project folder."""
    # Only `relctl init` needs the schema walk (pydantic models of every gate); other commands skip it.
    from release.commands.config_doc import release_yaml_text  # noqa: PLC0415

    texts = {"release.yaml": release_yaml_text()}
    for dest, name in STARTER_FILES.items():
        texts[dest] = template_text(name)
    workflow = texts[".github/workflows/promote.yml"]
    if source is not None:
        if workflow.count(SOURCE_LINE) != 1:
            raise InputError("the promote workflow template has no RELCTL_SOURCE line to fill in",
                             hint="reinstall relctl; its templates are damaged")
        filled = f"  RELCTL_SOURCE: {yaml_scalar(source)}"
        texts[".github/workflows/promote.yml"] = workflow.replace(SOURCE_LINE, filled)
    return texts


def init_project(target: Path, force: bool = False, source: str | None = None) -> InitResult:
    """Write the starter files into `target` (created if missing); refuse to overwrite unless `force`."""
    if target.exists() and not target.is_dir():
        raise InputError(f"{target}: not a folder", hint="pass a folder for the new project")
    texts = starter_texts(source)
    own = _configured_template(target)
    if own is not None:
        # A project whose release.yaml already chose an engine with its own InferenceService gets that
        # template, and keeps that release.yaml.
        texts[f"deploy/{Path(own).name}"] = template_text(own)  # a plug-in's own template is a path
        del texts["release.yaml"]
    existing = [rel for rel in texts if (target / rel).exists()]
    if existing and not force:
        raise InputError(f"{target}: {', '.join(existing)} already exist{'s' if len(existing) == 1 else ''}",
                         hint="pass --force to overwrite them (your .gitignore is only ever appended to)")
    result = InitResult(project_dir=str(target), relctl_source=source, tracking_export=tracking_export(target))
    for rel, text in texts.items():
        _write_atomically(target / rel, text)
        result.written.append(rel)
    result.gitignore = _ensure_gitignore(target / ".gitignore")
    # Signed from the first release: the project's key pair (private under the git-ignored .relctl/, public
    # committed as the trusted key); a project that has one keeps it.
    from release.signing.keygen import create_keypair  # noqa: PLC0415 - the CLI's import stays light (no yaml)

    pair = create_keypair(target, if_missing=True) if not _has_release_key(target) else None
    if pair is not None and pair.created:
        result.written += [str(pair.private.relative_to(target)), str(pair.public.relative_to(target))]
        result.release_key = pair.fingerprint
    return result


def _configured_template(target: Path) -> str | None:
    """The KServe template of the backend the release.yaml in `target` names, when it is not relctl serve's."""
    from release.backends import available_backends  # noqa: PLC0415 - entry points, only for init

    backend = available_backends().get(_configured_backend(target) or "")
    template = backend.deploy().kserve_template if backend is not None else None
    return template if template is not None and template != DEFAULT_KSERVE_TEMPLATE else None


def _has_release_key(target: Path) -> bool:
    from release.signing.keys import DEFAULT_KEY, DEFAULT_PUBLIC  # noqa: PLC0415

    return (target / DEFAULT_PUBLIC).exists() or (target / DEFAULT_KEY).exists()


def _configured_backend(target: Path) -> str | None:
    """convert.backend of the release.yaml already in `target`, if it names one."""
    from release.core.jsonfile import load_yaml  # noqa: PLC0415

    path = target / "release.yaml"
    data = load_yaml(path, hint="fix or remove it, then run relctl init again", label=str(path)) \
        if path.is_file() else None
    convert = data.get("convert") if isinstance(data, dict) else None
    backend = convert.get("backend") if isinstance(convert, dict) else None
    return backend if isinstance(backend, str) else None


def tracking_export(target: Path) -> str:
    """`export MLFLOW_TRACKING_URI=...` naming the store relctl reads for `target`.

    With MLFLOW_TRACKING_URI unset, MLflow logs to ./mlflow.db of the current folder while relctl reads
    the project's .relctl/mlflow.db (its location never depends on the current folder); one exported
    variable makes the training script and relctl agree.
    """
    from release.registry.store import resolve_store  # noqa: PLC0415 - only init prints it

    return f"export MLFLOW_TRACKING_URI={shlex.quote(resolve_store(target).tracking_uri)}"


def _write_atomically(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    with os.fdopen(fd, "w") as fh:
        fh.write(text)
    os.chmod(tmp, 0o644)
    os.replace(tmp, path)


def _ensure_gitignore(path: Path) -> str:
    if not path.exists():
        path.write_text(f"# relctl's embedded MLflow store, stage outputs and logs\n{GITIGNORE_LINE}\n")
        return "created"
    text = path.read_text()
    if any(line.strip() in (GITIGNORE_LINE, GITIGNORE_LINE.rstrip("/")) for line in text.splitlines()):
        return "unchanged"
    path.write_text(text + ("" if text.endswith("\n") or not text else "\n") + f"{GITIGNORE_LINE}\n")
    return "appended"
