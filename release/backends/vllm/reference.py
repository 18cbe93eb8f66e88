"""The fp32 reference of a vLLM release: PyTorch eager on the reference build's safetensors (the shared
TorchReference, release/backends/torch_reference.py; imported from here as it always was)."""

from __future__ import annotations

from release.backends.torch_reference import TorchReference

__all__ = ["TorchReference"]
