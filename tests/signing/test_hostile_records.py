"""Signature records read through the one bounded loader: a hostile approval statement, provenance or bundle
is no record (not approved, no provenance, no signer), never a crash (issue 32: one loader for every file)."""

from __future__ import annotations

from pathlib import Path

import pytest

from release.core.package import PROVENANCE, SIGNATURE
from release.signing.approval import parse_statement
from release.signing.package import _provenance, signer_of

HOSTILE = {
    "deep": "[" * 100_000 + "]" * 100_000,
    "duplicate keys": '{"version": "1", "version": "2"}',
    "garbage": "\x00\xff not json",
    "a list": "[1, 2]",
}


@pytest.mark.parametrize("text", HOSTILE.values(), ids=HOSTILE.keys())
def test_a_hostile_approval_statement_is_no_statement(text: str) -> None:
    assert parse_statement(text) == {}


@pytest.mark.parametrize("text", HOSTILE.values(), ids=HOSTILE.keys())
def test_hostile_provenance_and_bundle_are_no_record(tmp_path: Path, text: str) -> None:
    (tmp_path / PROVENANCE).write_text(text)
    (tmp_path / SIGNATURE).write_text(text)
    assert _provenance(tmp_path) == {}
    assert signer_of(tmp_path) is None


def test_a_well_formed_statement_still_reads() -> None:
    assert parse_statement('{"model": "m", "version": "3"}') == {"model": "m", "version": "3"}
