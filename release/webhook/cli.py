"""The `relctl webhook` command and what a release event starts: a promote subprocess or a GitHub
repository_dispatch (see release.webhook.receiver for the receiver itself)."""

from __future__ import annotations

import json
import os
import re
import shlex
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import click

from release.commands.support import Ctx, handled
from release.core.errors import InputError

if TYPE_CHECKING:  # release.webhook.receiver imports mlflow: only `relctl webhook` itself pays for that
    from release.webhook.receiver import ReleaseRequest, Trigger

PLACEHOLDERS = ("{run_id}", "{model}", "{version}")
DEFAULT_MAX_BODY = 1024 * 1024  # release.webhook.receiver.DEFAULT_MAX_BODY (not imported: it would import mlflow)


def default_command(project_dir: Path) -> list[str]:
    """`relctl --project-dir DIR promote --model {model} --json -- {run_id}`, with this installation's relctl.

    `--` ends the options: whatever a delivery carries, the run id is never read as one (the receiver
    also refuses run ids that are not 32 hex digits)."""
    beside = Path(sys.executable).parent / "relctl"
    relctl = str(beside) if beside.is_file() else "relctl"
    return [relctl, "--project-dir", str(project_dir), "promote", "--model", "{model}", "--json", "--", "{run_id}"]


def fill(template: list[str], request: ReleaseRequest) -> list[str]:
    """The command for one release; each value fills a placeholder inside one argument (no shell)."""
    values = {"{run_id}": request.run_id, "{model}": request.model, "{version}": request.version}
    out = []
    for arg in template:
        for placeholder, value in values.items():
            arg = arg.replace(placeholder, value)
        out.append(arg)
    return out


def command_trigger(template: list[str], log_dir: Path) -> Trigger:
    """Start `template` (filled in) as a subprocess per release; its output goes to a log file."""

    def start(request: ReleaseRequest) -> str:
        argv = fill(template, request)
        log_dir.mkdir(parents=True, exist_ok=True)
        safe = re.sub(r"[^A-Za-z0-9_.-]", "_", request.model)
        log = log_dir / f"promote-{safe}-v{request.version}-{time.strftime('%Y%m%dT%H%M%S')}.log"
        with log.open("ab") as fh:
            proc = subprocess.Popen(argv, stdout=fh, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                    start_new_session=True)
        # Reaped in the background: the receiver answers MLflow at once, the promote takes minutes.
        threading.Thread(target=proc.wait, daemon=True).start()
        return f"pid {proc.pid}: {shlex.join(argv)} (log {log})"

    return start


def github_trigger(repository: str, token: str, api_url: str, event_type: str) -> Trigger:
    """POST a repository_dispatch `event_type` with {run_id, model, version} to GitHub's REST API."""
    import httpx

    url = f"{api_url.rstrip('/')}/repos/{repository}/dispatches"

    def start(request: ReleaseRequest) -> str:
        payload = {"event_type": event_type,
                   "client_payload": {"run_id": request.run_id, "model": request.model, "version": request.version}}
        headers = {"Authorization": f"Bearer {token}", "Accept": "application/vnd.github+json",
                   "X-GitHub-Api-Version": "2022-11-28"}
        response = httpx.post(url, json=payload, headers=headers, timeout=15.0)
        if response.status_code // 100 != 2:
            raise RuntimeError(f"GitHub answered {response.status_code} to repository_dispatch: {response.text[:200]}")
        return f"repository_dispatch '{event_type}' to {repository}"

    return start


def version_run_lookup(project_dir: Path) -> Callable[[str, str], str | None]:
    """A function (model, version) -> the version's source run id, read from the registry."""
    from release.registry import Registry
    from release.registry.store import resolve_store

    def lookup(model: str, version: str) -> str | None:
        run_id = Registry(resolve_store(project_dir)).get_version(model, version).run_id
        return str(run_id) if run_id else None

    return lookup


def _secret(env_name: str, what: str) -> str:
    value = os.environ.get(env_name, "")
    if not value:
        raise InputError(f"{what}: environment variable {env_name} is not set",
                         hint=f"export {env_name}=... (the value is never read from the command line)")
    return value


@click.command("webhook")
@click.option("--host", default="127.0.0.1", show_default=True, help="Interface to listen on.")
@click.option("--port", default=8085, show_default=True, type=click.IntRange(0, 65535),
              help="Port to listen on (0: any free port; see --ready-file).")
@click.option("--secret-env", default="RELCTL_WEBHOOK_SECRET", show_default=True,
              help="Environment variable holding the webhook's shared secret (as given to MLflow's create_webhook).")
@click.option("--tag", "release_tag", default="relctl.release=true", show_default=True, metavar="KEY=VALUE",
              help="The model-version tag that asks for a release.")
@click.option("--max-age", "max_age_s", default=300.0, show_default=True, type=click.FloatRange(min=1),
              help="Seconds a delivery's timestamp may differ from now; older ones are refused.")
@click.option("--max-body-bytes", "max_body_bytes", default=DEFAULT_MAX_BODY, show_default=True,
              type=click.IntRange(min=1024), help="Longest delivery body read; a longer one is refused (413) unread.")
@click.option("--max-connections", default=64, show_default=True, type=click.IntRange(min=4),
              help="Open connections at most; past it, the client waiting longest for its headers is dropped.")
@click.option("--header-timeout", "header_timeout_s", default=10.0, show_default=True, type=click.FloatRange(min=0.1),
              help="Seconds a client has to send its request headers (and, again, its body) before it is dropped.")
@click.option("--command", "command", default=None, metavar="CMD",
              help="What a release starts, with {run_id} {model} {version} filled in "
                   "[default: relctl --project-dir DIR promote --model {model} --json -- {run_id}].")
@click.option("--github-repo", default=None, metavar="OWNER/REPO",
              help="Instead of a subprocess, send a repository_dispatch to this repository's promote workflow.")
@click.option("--github-api-url", default="https://api.github.com", show_default=True, help="GitHub API base URL.")
@click.option("--github-token-env", default="GITHUB_TOKEN", show_default=True,
              help="Environment variable holding a token allowed to dispatch to --github-repo.")
@click.option("--event-type", default="relctl-promote", show_default=True, help="repository_dispatch event type.")
@click.option("--ready-file", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="Write {url, pid} as JSON here once listening.")
@click.pass_obj
@handled
def webhook_command(ctx: Ctx, host: str, port: int, secret_env: str, release_tag: str, max_age_s: float,
                    max_body_bytes: int, max_connections: int, header_timeout_s: float, command: str | None,
                    github_repo: str | None, github_api_url: str,
                    github_token_env: str, event_type: str, ready_file: Path | None) -> None:
    """Receive MLflow model-registry webhooks (model_version.created, model_version_tag.set): verify the
    HMAC signature, refuse stale or replayed deliveries (401), and start one promote of the source run of
    each version tagged for release."""
    import uvicorn

    from release.webhook.guard import ConnectionLimits, guarded_protocol
    from release.webhook.receiver import WebhookSettings, create_app

    key, sep, value = release_tag.partition("=")
    if not sep or not key:
        raise InputError(f"--tag {release_tag}: expected KEY=VALUE", hint="e.g. --tag relctl.release=true")
    if command is not None and github_repo is not None:
        raise InputError("--command and --github-repo both given", hint="choose one way to start a promote")
    state = ctx.project_dir / ".relctl" / "webhook"
    if github_repo is not None:
        if not re.fullmatch(r"[A-Za-z0-9_.-]+/[A-Za-z0-9_.-]+", github_repo):
            raise InputError(f"--github-repo {github_repo}: expected OWNER/REPO", hint="e.g. --github-repo acme/models")
        trigger = github_trigger(github_repo, _secret(github_token_env, "--github-repo"), github_api_url, event_type)
    else:
        template = shlex.split(command) if command is not None else default_command(ctx.project_dir)
        if not template or not any(p in arg for arg in template for p in PLACEHOLDERS):
            raise InputError(f"--command {command!r}: names no {{run_id}}, {{model}} or {{version}}",
                             hint="e.g. --command 'relctl promote --json -- {run_id}'")
        trigger = command_trigger(template, state / "logs")
    settings = WebhookSettings(secret=_secret(secret_env, "relctl webhook"), state_dir=state, trigger=trigger,
                               version_run=version_run_lookup(ctx.project_dir),
                               release_tag=key, release_value=value, max_age_s=max_age_s,
                               max_body_bytes=max_body_bytes, body_timeout_s=header_timeout_s)
    limits = ConnectionLimits(header_timeout_s=header_timeout_s, max_connections=max_connections)
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        raise InputError(f"cannot listen on {host}:{port}: {exc.strerror}", hint="choose another --port") from exc
    sock.listen(128)
    url = f"http://{host}:{sock.getsockname()[1]}/"
    if ready_file is not None:
        ready_file.write_text(json.dumps({"url": url, "pid": os.getpid()}))
    click.echo(f"relctl webhook at {url}: a version tagged {key}={value} starts "
               + (f"a repository_dispatch to {github_repo}" if github_repo else "a promote subprocess"), err=True)
    # h11, not httptools: its incomplete-event limit bounds header bytes; guarded_protocol bounds the rest.
    server = uvicorn.Server(uvicorn.Config(create_app(settings), log_level="warning", access_log=False,
                                           http=guarded_protocol(limits),
                                           h11_max_incomplete_event_size=limits.max_header_bytes))
    server.run(sockets=[sock])
