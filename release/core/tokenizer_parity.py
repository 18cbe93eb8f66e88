"""Tokenizer parity: the served tokenizer must encode exactly like the training one (BOS included).

Used by convert (to align the runtime tokenizer) and validate (to prove it); it lives here so neither
stage imports the other.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from release.core.errors import InputError
from release.core.tokenizer_file import load_tokenizer

# Strings every served tokenizer must encode like the training one, beside the prompts themselves.
EDGE_STRINGS = ("", " ", "   \t\n  ", "naïve café ✓ 日本語 🙂", "  leading and trailing  ", "Hello world")


@dataclass(frozen=True)
class TokenizerParity:
    """Served vs training tokenizer on `checked` strings; the first mismatch with both id lists."""

    passed: bool
    checked: int
    first_mismatch: dict[str, Any] | None = None


def compare_tokenizers(
    encode: Callable[[str], list[int]], training_tokenizer: Path, texts: list[str]
) -> TokenizerParity:
    """Compare `encode` (the served tokenizer) with tokenizers' encode of `training_tokenizer` (BOS included)."""

    if not training_tokenizer.is_file():
        raise InputError(f"{training_tokenizer}: training tokenizer not found",
                         hint="pass the checkpoint's tokenizer.json")
    training = load_tokenizer(training_tokenizer)
    for text in texts:
        served, expected = encode(text), list(training.encode(text).ids)
        if served != expected:
            return TokenizerParity(
                passed=False,
                checked=len(texts),
                first_mismatch={"text": text, "served_ids": served, "training_ids": expected},
            )
    return TokenizerParity(passed=True, checked=len(texts))
