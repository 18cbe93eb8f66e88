"""`relctl init`: the command; the project it writes is release/commands/init.py's."""

from __future__ import annotations

import os
from pathlib import Path

import click

from release.commands.init import init_project, relctl_source
from release.commands.support import Ctx, emit, handled, json_option


@click.command("init")
@click.argument("directory", required=False, type=click.Path(file_okay=False, path_type=Path))
@click.option("--force", is_flag=True, help="Overwrite starter files that already exist.")
@json_option
@click.pass_obj
@handled
def init_command(ctx: Ctx, directory: Path | None, force: bool, as_json: bool) -> None:
    """Start a relctl project in DIRECTORY (default: --project-dir): release.yaml with every key and its
    default, the GitHub promote workflow, KServe manifest and Dockerfiles, and .relctl/ in .gitignore."""
    ctx.as_json = as_json
    target = (directory or ctx.project_dir).resolve()
    result = init_project(target, force=force, source=relctl_source())

    def text() -> None:
        for rel in result.written:
            click.echo(f"wrote {rel}")
        click.echo(f".gitignore: {result.gitignore}")
        if "MLFLOW_TRACKING_URI" in os.environ:
            click.echo("runs: relctl reads the MLFLOW_TRACKING_URI already set; log your training runs there")
        else:
            click.echo("runs: log your training runs where relctl reads them; in the shell that trains, run")
            click.echo(f"  {result.tracking_export}")
        if result.release_key:
            from release.signing.keys import DEFAULT_KEY, DEFAULT_PUBLIC

            click.echo(f"release key: {DEFAULT_KEY} (private, git-ignored, 0600) and {DEFAULT_PUBLIC} (commit it); "
                       f"fingerprint {result.release_key[:16]}. CI signs with the same key: store the private key's "
                       "text as the repository secret RELCTL_SIGNING_KEY")
        if result.relctl_source is None:
            click.echo("next: set RELCTL_SOURCE in .github/workflows/promote.yml to where relctl installs from "
                       "(e.g. git+https://github.com/ORG/relctl@v0.1.0), and the repository secrets "
                       "MLFLOW_TRACKING_URI and MLFLOW_TRACKING_TOKEN")
        else:
            click.echo("next: set the repository secrets MLFLOW_TRACKING_URI and MLFLOW_TRACKING_TOKEN")

    emit(result.__dict__, as_json, text)


@click.command("keygen")
@click.option("--if-missing", is_flag=True, help="Do nothing (exit 0) when the project has its key pair already.")
@json_option
@click.pass_obj
@handled
def keygen_command(ctx: Ctx, if_missing: bool, as_json: bool) -> None:
    """Make the project's release key pair: the private key at .relctl/keys/release.pem (git-ignored, mode 0600)
    and its public half at keys/release.pub (commit it: the project's trusted key). Every release is signed
    with it; CI takes the private key from the RELCTL_SIGNING_KEY secret."""
    from release.signing.keygen import create_keypair

    pair = create_keypair(ctx.project_dir.resolve(), if_missing=if_missing)
    data = {"private_key": str(pair.private), "public_key": str(pair.public), "fingerprint": pair.fingerprint,
            "created": pair.created}

    def text() -> None:
        if not pair.created:
            click.echo(f"release key {pair.fingerprint[:16]} exists: {pair.public}")
            return
        click.echo(f"wrote {pair.private} (private: keep it out of git; mode 0600)")
        click.echo(f"wrote {pair.public} (public: commit it; the project's trusted key)")
        click.echo(f"fingerprint {pair.fingerprint[:16]}; for CI, store the private key's text as the secret "
                   "RELCTL_SIGNING_KEY")

    emit(data, as_json, text)


@click.command("sign")
@click.argument("model")
@click.option("--version", default=None, help="Only this version [default: every unsigned version of MODEL].")
@json_option
@click.pass_obj
@handled
def sign_command(ctx: Ctx, model: str, version: str | None, as_json: bool) -> None:
    """Move MODEL's versions released unsigned (before signing, or under `signing: off`) to signing: each package
    is checked against the digest recorded at its release, then signed with the release key (docs/signing.md)."""
    from release.commands import api

    done = api.sign_versions(model, ctx.project_dir, version)
    def text() -> None:
        for d in done:
            click.echo(f"{model} v{d.version}: {d.outcome}")

    emit([{"version": d.version, "outcome": d.outcome} for d in done], as_json, text)


@click.command("digest")
@click.argument("directory", type=click.Path(path_type=Path))
@json_option
@click.pass_obj
@handled
def digest_command(ctx: Ctx, directory: Path, as_json: bool) -> None:
    """The base digest of the base weights in checkpoint DIRECTORY (its *.safetensors, adapter files excluded):
    what a training run logs as tag relctl.base_sha256 so an adapter release onto another base is refused
    before any download (without it relctl computes the same digest from the run's checkpoint at intake)."""
    from release.core.checkpoint import weight_files
    from release.core.errors import InputError
    from release.core.hashing import sha256_file
    from release.core.weights_digest import base_digest

    ctx.as_json = as_json
    if not directory.is_dir():
        raise InputError(f"{directory}: no such folder",
                         hint="pass the checkpoint folder the adapter trained on (config.json, *.safetensors)")
    weights = {p.name: sha256_file(p) for p in weight_files(directory)}
    digest = base_digest(weights)
    emit({"directory": str(directory), "base_sha256": digest, "weights_sha256": weights}, as_json,
         lambda: click.echo(digest))
