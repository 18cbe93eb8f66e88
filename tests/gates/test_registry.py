"""Gate discovery and configuration: entry points, release.yaml order, one-line config errors."""

from __future__ import annotations

from typing import Any

import pytest

from gates.eval import EvalConfig, EvalGate
from gates.safety import SafetyGate
from release.core.errors import ConfigError
from release.gating.plugins import available_gates, load_gates


def config_error(block: dict[str, Any]) -> ConfigError:
    with pytest.raises(ConfigError) as info:
        load_gates(block)
    assert "\n" not in info.value.message and info.value.hint
    return info.value


def test_builtins_are_entry_points_and_ids_match() -> None:
    gates = available_gates()
    assert gates["eval"] is EvalGate and gates["safety"] is SafetyGate


def test_gates_come_back_in_release_yaml_order_with_validated_config() -> None:
    gates = load_gates({"safety": {"max_rate": {"harmful": 0.1}}, "eval": None})
    assert [g.id for g in gates] == ["safety", "eval"]
    assert isinstance(gates[1], EvalGate) and gates[1].config == EvalConfig()


def test_unknown_gate_id_suggests_the_closest() -> None:
    err = config_error({"evl": {}})
    assert err.message == "release.yaml: unknown gate 'gates.evl'"
    assert err.hint == "did you mean 'eval'?"


def test_unknown_and_invalid_keys_name_the_full_path() -> None:
    err = config_error({"eval": {"max_new_token": 8}})
    assert err.message == "release.yaml: unknown key 'gates.eval.max_new_token'"
    assert err.hint == "did you mean 'max_new_tokens'?"
    err = config_error({"eval": {"thresholds": {"exact_match": {"treshold": 0.5}}}})
    assert err.message == "release.yaml: unknown key 'gates.eval.thresholds.exact_match.treshold'"
    err = config_error({"safety": {"max_rate": {"harmful": 1.5}}})
    assert err.message.startswith("release.yaml: gates.safety.max_rate.harmful: Input should be less than")
    err = config_error({"safety": {"max_new_tokens": 0}})
    assert err.message.startswith("release.yaml: gates.safety.max_new_tokens: Input should be greater than")


def test_metric_names_and_threshold_targets_are_checked_at_config_time() -> None:
    err = config_error({"eval": {"metrics": ["exact_match", "acuracy"]}})
    assert err.message == "gates.eval.metrics: unknown metric 'acuracy'"
    err = config_error({"eval": {"metrics": ["exact_match"], "thresholds": {"perplexity": {"threshold": 2}}}})
    assert err.message == "release.yaml: gates.eval.thresholds.perplexity: 'perplexity' is not in gates.eval.metrics"
