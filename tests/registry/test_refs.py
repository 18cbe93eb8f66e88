"""The one parser of MODEL@ALIAS / MODEL/VERSION (release/registry/refs.py): each command's spellings taken,
everything else refused in that command's words (one error, one hint), before any registry call. Pure
parsing: no store is opened."""

from __future__ import annotations

import pytest

from release.core.errors import InputError
from release.registry.refs import APPROVE, ONTO, PINNED, TRACE, ModelRef, parse_ref, parse_version, serve_ref


def refused(spec: str, parse: object) -> InputError:
    with pytest.raises(InputError) as info:
        parse(spec)  # type: ignore[operator]
    assert info.value.hint, spec
    return info.value


def test_each_command_takes_its_spellings() -> None:
    assert parse_ref("tiny-llm@production", ONTO) == ModelRef("tiny-llm", alias="production")
    assert parse_ref("tiny-llm/3", ONTO) == ModelRef("tiny-llm", version="3")
    assert str(parse_ref("tiny-llm@production", ONTO)) == "tiny-llm@production"
    assert serve_ref("models:/m/3") == ModelRef("m", version="3") and serve_ref("m@prod").alias == "prod"
    assert serve_ref("team/m/12").model == "team/m"  # serve reads any name MLflow holds
    assert parse_version("tiny-llm/3", APPROVE) == ("tiny-llm", "3")
    assert parse_version("models:/tiny-llm/3", PINNED) == ("tiny-llm", "3")
    assert parse_version("tiny-llm:3", TRACE) == parse_version("tiny-llm/3", TRACE) == ("tiny-llm", "3")


def test_what_a_command_does_not_take_is_refused_in_its_words() -> None:
    onto = refused("tiny-llm", lambda s: parse_ref(s, ONTO))
    assert onto.message == "--onto 'tiny-llm' names no base version" and "MODEL@production" in (onto.hint or "")
    assert refused("tiny-llm@pro duction", lambda s: parse_ref(s, ONTO)).message == \
        "--onto 'tiny-llm@pro duction': 'pro duction' is not an alias name"
    assert refused("tiny llm@production", lambda s: parse_ref(s, ONTO)).message.startswith(
        "--onto: model name 'tiny llm' is not valid")
    assert refused("m@production", lambda s: parse_version(s, APPROVE)).message == \
        "m@production: expected MODEL/VERSION (a version number)"
    pinned = refused("m@production", lambda s: parse_version(s, PINNED))
    assert "not a pinned version" in pinned.message and "relctl status MODEL" in (pinned.hint or "")
    assert "expected MODEL/VERSION" in refused("m/latest", lambda s: parse_version(s, PINNED)).message
    assert "out of range" in refused("m/0", lambda s: parse_version(s, PINNED)).message
    assert refused("m", lambda s: parse_version(s, TRACE)).message.startswith("'m' is not MODEL:VERSION")
    for bad in ("m", "m/", "m/v1", "@prod", "models:/m", "models:/m/x"):
        problem = refused(bad, serve_ref)
        assert "MODEL" in problem.message + (problem.hint or ""), bad
    assert refused("models:/m", serve_ref).message == "models:/m: expected models:/MODEL/VERSION or models:/MODEL@ALIAS"
