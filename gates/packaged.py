"""Opening a package's model through the same runtime that serves it."""

from __future__ import annotations

from pathlib import Path

from release.errors import InputError
from release.runtime import GenaiModel


def load_package_model(package_dir: Path) -> GenaiModel:
    """The GenaiModel in `package_dir/model` (a relctl package) or `package_dir` itself (a bare model folder)."""
    model_dir = package_dir / "model"
    if not model_dir.is_dir():
        if not (package_dir / "genai_config.json").is_file():
            raise InputError(f"{package_dir}: not a relctl package (no model/ folder)",
                             hint="pass the folder relctl promote built (it holds relctl-package.json)")
        model_dir = package_dir
    return GenaiModel.load(model_dir)


def complete(model: GenaiModel, prompt: str, max_new_tokens: int) -> str:
    """The greedy answer to `prompt` as text, EOS dropped and surrounding whitespace stripped."""
    eos = set(model.eos_token_ids)
    ids = model.generate(prompt, max_new_tokens).token_ids
    return model.decode([i for i in ids if i not in eos]).strip()
