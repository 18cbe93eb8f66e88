"""Precision variants: a precision plus the build options that change its numbers (a quantizer, mixed
int8 placements), as one string a backend builds and every report names.

    int4                                   the backend's default build at int4
    int4+algo=k_quant                      int4 with the builder's k_quant method
    int4+mixed=last_matmul:int8            int4 body, the last MatMul at int8
    int4+int8=layers.1,lm_head             int4 body, these units at int8 (precision: auto's retry)
    int4+int4_only=layers.0                int8 everywhere but this unit (per-unit sensitivity)

Only the precision (the part before the first "+") is the build's precision everywhere else (memory plan,
package manifest); the options are the backend's, which says which it takes (`Backend.precision_variants`).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from release.core.errors import InputError

AUTO_PRECISION = "auto"


@dataclass(frozen=True)
class Variant:
    precision: str
    options: tuple[tuple[str, str], ...] = field(default_factory=tuple)

    @property
    def name(self) -> str:
        return "+".join([self.precision, *(f"{k}={v}" for k, v in self.options)])

    def option(self, key: str) -> str | None:
        return next((v for k, v in self.options if k == key), None)

    def with_option(self, key: str, value: str) -> Variant:
        return Variant(self.precision, (*((k, v) for k, v in self.options if k != key), (key, value)))


def parse_variant(text: str) -> Variant:
    """`int4+algo=rtn` -> Variant("int4", (("algo", "rtn"),)); InputError (exit 2) naming a malformed part:
    a precision is user input (release.yaml, --precision), so its grammar is never a relctl bug."""
    precision, *parts = text.split("+")
    if not precision:
        raise InputError(f"precision '{text}': nothing before the first '+'", hint=_GRAMMAR)
    options: list[tuple[str, str]] = []
    for part in parts:
        key, sep, value = part.partition("=")
        if not sep or not key or not value:
            raise InputError(f"precision '{text}': option '{part}' is not key=value", hint=_GRAMMAR)
        options.append((key, value))
    return Variant(precision, tuple(options))


_GRAMMAR = ("write PRECISION or PRECISION+KEY=VALUE[+KEY=VALUE...], e.g. int4 or int4+algo=k_quant "
            "(docs/precision-auto.md)")


def base_precision(text: str) -> str:
    """The precision a variant builds at (what memory plans and package manifests record)."""
    return text.split("+", 1)[0]
