"""The hint after a validation failure names the precision to try: the next one up towards the reference."""

from __future__ import annotations

import pytest

from release.pipeline.advice import after_validation_failure


@pytest.mark.parametrize(("failed", "up"), [("int4", "int8"), ("int8", "fp16"), ("fp16", "fp32")])
def test_a_quantized_candidate_is_pointed_at_the_next_precision_up(failed: str, up: str) -> None:
    hint = after_validation_failure(failed)
    assert hint.startswith(f"{failed} loses too much against the fp32 reference: {up}, the next precision up")
    assert f"--precision {up}" in hint and hint.endswith(f"only if {up} fails too")


def test_an_fp32_candidate_is_not_told_to_change_precision() -> None:
    hint = after_validation_failure("fp32")
    assert "--precision" not in hint and "nothing was quantized" in hint
