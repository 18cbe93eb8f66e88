"""Opening a package's model through the same backend that serves it."""

from __future__ import annotations

from pathlib import Path

from release.backends import backend_for_folder, backend_of
from release.backends.base import LoadedModel
from release.core.package import MANIFEST, read_manifest


def load_package_model(package_dir: Path) -> LoadedModel:
    """The model in `package_dir/model` (a relctl package, loaded by the backend its manifest names) or
    `package_dir` itself (a bare built folder, loaded by the backend whose runtime files it holds). The gate
    runner verified the package before any gate ran."""
    if (package_dir / MANIFEST).is_file():
        manifest = read_manifest(package_dir)
        return backend_of(manifest).load(manifest.model_dir)
    model_dir = package_dir / "model" if (package_dir / "model").is_dir() else package_dir
    return backend_for_folder(model_dir).load(model_dir)


def complete(model: LoadedModel, prompt: str, max_new_tokens: int) -> str:
    """The greedy answer to `prompt` as text, EOS dropped and surrounding whitespace stripped."""
    eos = set(model.eos_token_ids)
    ids = model.generate(prompt, max_new_tokens).token_ids
    return model.decode([i for i in ids if i not in eos]).strip()
