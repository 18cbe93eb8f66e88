"""Serving and validating with LoRA adapters on a LoRA-ready onnxruntime-genai base (adapters.py builds the
base and the adapter files): og.Adapters loads each `.onnx_adapter`, and a generator runs with one set
active (`Generator.set_active_adapter`), which feeds its tensors over the base's zero LoRA initializers."""

from __future__ import annotations

import logging
import threading
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from release.backends.jobs import Job
from release.backends.onnxruntime_genai.adapters import MODEL_FILE, adapter_file, adapter_parameters_of, lora_inputs
from release.backends.onnxruntime_genai.model import GenaiModel
from release.backends.onnxruntime_genai.runner import GenaiRunner
from release.core.errors import InputError
from release.core.server_settings import ServerSettings

log = logging.getLogger("relctl.serve")


class GenaiAdapterModel(GenaiModel):
    """A LoRA-ready base with one adapter active on every generator: the engine's own LoRA path, what an
    adapter release validates against the merged reference (logits and greedy text alike)."""

    NAME = "candidate"

    def __init__(self, base: GenaiModel, folder: Path) -> None:
        import onnxruntime_genai as og  # noqa: PLC0415 - native libraries; only when a model is loaded

        super().__init__(base.model_dir, base._model, base._tokenizer, base._config)
        self._adapters = og.Adapters(self._model)
        self._adapters.load(str(adapter_file(folder)), self.NAME)
        self._params = adapter_parameters_of(folder)

    def _generator(self, params: Any) -> Any:
        generator = super()._generator(params)
        generator.set_active_adapter(self._adapters, self.NAME)
        return generator

    def _feeds(self, session: Any, ids: list[int]) -> dict[str, np.ndarray]:
        # A sequence at the context's end runs model.onnx directly: the adapter's tensors override the zero
        # LoRA initializers there too, as og feeds them.
        return {**super()._feeds(session, ids), **self._params}


class GenaiAdapterRunner(GenaiRunner):
    """relctl's server on a LoRA-ready base: a job whose `adapter` names a loaded one generates with it set
    active on its own generator (og.Adapters, one set per model). og refuses to unload an adapter a running
    generator holds: such an unload is finished when the last job using it ends; no new job gets it."""

    def __init__(self, model_dir: Path, settings: ServerSettings, adapters: Mapping[str, Path]) -> None:
        super().__init__(model_dir, settings)
        if not lora_inputs(model_dir):
            raise InputError(f"{model_dir.parent.name}: the base was not built LoRA-ready (no LoRA inputs in "
                             f"{MODEL_FILE})", hint="re-release it with convert.onnxruntime-genai.adapters set "
                                                    "(docs/adapters.md)")
        self._adapters = self._og.Adapters(self.model)
        self._loaded: set[str] = set()
        self._retiring: set[str] = set()
        self._lock = threading.Lock()
        for name, folder in adapters.items():
            self.load_adapter(name, folder)

    def load_adapter(self, name: str, folder: Path) -> None:
        path = adapter_file(folder)
        with self._lock:
            if name in self._loaded:
                raise InputError(f"adapter {name} is already loaded", hint="load a new version under its own name")
            if name in self._retiring:  # og still holds it (its unload was deferred): serve it again as it is
                self._retiring.discard(name)
            else:
                self._adapters.load(str(path), name)
            self._loaded.add(name)

    def unload_adapter(self, name: str) -> None:
        with self._lock:
            if name not in self._loaded:
                raise InputError(f"adapter {name} is not loaded", hint="GET /admin/adapters lists them")
            self._loaded.discard(name)
            self._retiring.add(name)
        self._finish_unloads()

    def _generator(self, job: Job) -> Any:
        generator = super()._generator(job)
        if job.adapter is not None:
            with self._lock:
                if job.adapter not in self._loaded:
                    raise InputError(f"adapter {job.adapter} is not loaded", hint="GET /admin/adapters lists them")
                generator.set_active_adapter(self._adapters, job.adapter)
        return generator

    def decode_loop(self, job: Job) -> tuple[str, int]:
        try:
            return super().decode_loop(job)
        finally:
            if job.adapter is not None:
                self._finish_unloads()

    def _finish_unloads(self) -> None:
        with self._lock:
            for name in sorted(self._retiring):
                try:
                    self._adapters.unload(name)
                except Exception as exc:  # og: "Adapter still in use" while a generator holds it
                    log.debug("adapter %s: unload deferred: %s", name, exc)
                    continue
                self._retiring.discard(name)
