"""YAML through relctl's one loader (release/core/jsonfile.py): safe types only, bounded depth, duplicate keys
refused. Its own module so that PyYAML is imported only where a YAML file is read."""

from __future__ import annotations

import re
from typing import Any

import yaml

from release.core.errors import InputError
from release.core.jsonfile import MAX_DEPTH


class _UniqueKeyLoader(yaml.SafeLoader):  # type: ignore[misc]
    """PyYAML's safe loader, refusing a key given twice in one mapping (PyYAML keeps the last silently)."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: set[Any] = set()
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=deep)
            if isinstance(key, (str, int, float, bool)) and key in seen:
                raise yaml.constructor.ConstructorError(
                    None, None, f"key '{key}' appears twice in one mapping", key_node.start_mark)
            if isinstance(key, (str, int, float, bool)):
                seen.add(key)
        mapping: dict[Any, Any] = super().construct_mapping(node, deep=deep)
        return mapping


_YAML_QUOTED = re.compile(r""""(?:[^"\\\n]|\\.)*"|'(?:[^'\n]|'')*'|(?:^|\s)#[^\n]*""")
_YAML_FLOW = re.compile(r"[\[\]{}]")
_INDENT = re.compile(r"^[ \t]*", re.MULTILINE)


def _yaml_depth(text: str, max_depth: int) -> int:
    """Deepest collection nesting, or a number past `max_depth` as soon as it is clearly past it.

    PyYAML's scanner slows down sharply with flow nesting (a 1,000-deep `[[[...` takes seconds) and its
    composer recurses, so the text is first measured with regexes in C: flow brackets outside quoted
    strings and comments, and indentation (a block level needs at least one more column). Only a text
    within both bounds is walked through PyYAML's event stream, which does not recurse."""
    depth = deepest = 0
    for match in _YAML_FLOW.finditer(_YAML_QUOTED.sub("", text)):
        depth += 1 if match.group() in "[{" else -1
        deepest = max(deepest, depth)
    widest = max((len(m.group()) for m in _INDENT.finditer(text)), default=0)
    if deepest > max_depth or widest > 8 * max_depth:
        return max(deepest, widest // 8)
    depth = deepest = 0
    for event in yaml.parse(text, Loader=yaml.SafeLoader):
        if isinstance(event, yaml.CollectionStartEvent):
            depth += 1
            deepest = max(deepest, depth)
            if deepest > max_depth:
                break
        elif isinstance(event, yaml.CollectionEndEvent):
            depth -= 1
    return deepest


def parse_yaml(text: str, label: str, hint: str, max_depth: int = MAX_DEPTH) -> Any:
    """`text` as YAML (safe types only), bounded in depth, duplicate keys refused; InputError naming `label`."""
    try:
        depth = _yaml_depth(text, max_depth)
        if depth > max_depth:
            raise InputError(f"{label}: YAML nested more than {max_depth} levels deep ({depth} or more)", hint=hint)
        return yaml.load(text, Loader=_UniqueKeyLoader)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}" if mark is not None else ""
        problem = getattr(exc, "problem", None) or "syntax error"
        raise InputError(f"{label}: invalid YAML{where}: {problem}", hint=hint) from exc
    except RecursionError as exc:
        raise InputError(f"{label}: YAML nested too deeply", hint=hint) from exc
