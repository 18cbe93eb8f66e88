"""MLflow filter strings quote their values through one helper: a quote in a value is searched for exactly."""

from __future__ import annotations

from pathlib import Path

import pytest

from release.core.errors import InputError
from release.registry import Registry
from release.registry import tags as T
from release.registry.filters import identifier, literal
from release.registry.store import connect, resolve_store


def test_a_value_with_a_quote_is_found_exactly_and_one_with_both_is_refused(project_dir: Path) -> None:
    store = resolve_store(project_dir)
    connect(store)
    registry = Registry(store)
    registry.client.create_registered_model("m")
    for value in ("it's", "plain", 'say "hi"'):
        registry.client.create_model_version("m", source=(project_dir / "x").as_uri(), tags={T.TRAINING_RUN: value})
    assert [str(registry.find_versions("m", T.TRAINING_RUN, v)[0].version) for v in ("it's", "plain", 'say "hi"')] == \
        ["1", "2", "3"]
    assert registry.find_versions("m", T.TRAINING_RUN, "it") == []
    for bad in ("""both ' and " """, "back\\slash"):
        with pytest.raises(InputError):
            literal(bad)
    with pytest.raises(InputError):
        identifier("a`b")


def test_no_filter_string_in_release_pastes_a_value_between_quotes() -> None:
    """Every filter relctl builds quotes through `literal` (issue 40: gc pasted `name = '{name}'` and a model
    named team's-model was exit 3)."""
    import re

    root = Path(__file__).resolve().parents[2] / "release"
    pasted = re.compile(r"""(=|!=|LIKE|ILIKE)\s*(?:'\{|"\{|\\'\{)""")
    found = [f"{p.relative_to(root.parent)}:{n}" for p in root.rglob("*.py")
             for n, line in enumerate(p.read_text().splitlines(), 1)
             if pasted.search(line) and ("search_" in line or "filter" in line or "query" in line)]
    assert found == []
