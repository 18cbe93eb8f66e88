"""One plug-in loader for every entry-point group (issue 40): a metric or detector plug-in that exits, raises or
prints at import, or whose name differs from its entry point, no longer ends the command or passes as another;
the working plug-ins still load, and the broken one is exit 2 (naming its entry point) only where it is used.
Each plug-in is a real distribution (dist-info with entry_points.txt) on a private path."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from gates.detectors import available_detectors, detector_group
from gates.metrics import available_metrics, resolve_metrics
from release.core.errors import ConfigError

MODULES = {
    "exits": "import sys\nprint('{\"forged\": true}')\nsys.exit(0)\n",
    "misnamed": "class Thing:\n    name = 'exact_match'\n    greater_is_better = True\n    needs_logits = False\n"
                "    def __init__(self, options=None):\n        pass\n",
}


@pytest.fixture()
def hostile_plugins(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    site = tmp_path / "site"
    info = site / "relctl_hostile_plugins-0.1.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: relctl-hostile-plugins\nVersion: 0.1\n")
    lines = [f"{name} = relctl_hostile_{name}:Thing" for name in MODULES]
    (info / "entry_points.txt").write_text("\n".join(["[relctl.metrics]", *lines, "[relctl.detectors]", *lines, ""]))
    for name, code in MODULES.items():
        (site / f"relctl_hostile_{name}.py").write_text(code)
        monkeypatch.delitem(sys.modules, f"relctl_hostile_{name}", raising=False)
    monkeypatch.syspath_prepend(str(site))


def test_a_broken_metric_plugin_is_isolated_and_refused_only_where_named(hostile_plugins: None,
                                                                          capsys: pytest.CaptureFixture[str]) -> None:
    assert {"exact_match", "perplexity"} <= set(available_metrics()) and "exits" not in available_metrics()
    assert "forged" not in capsys.readouterr().out   # its print went to stderr: stdout is --json's
    assert [m.name for m in resolve_metrics(["exact_match"])] == ["exact_match"]
    with pytest.raises(ConfigError, match=r"metric plug-in 'relctl_hostile_exits:Thing' failed to load: it called "
                                          r"sys.exit\(0\)") as exited:
        resolve_metrics(["exits"])
    assert "fix or reinstall" in (exited.value.hint or "")
    with pytest.raises(ConfigError, match=r"name 'exact_match' differs from its entry-point name 'misnamed'"):
        resolve_metrics(["misnamed"])


def test_a_broken_detector_plugin_is_isolated_and_refused_only_where_named(hostile_plugins: None) -> None:
    assert {"refusal", "pii"} <= set(available_detectors()) and not {"exits", "misnamed"} & set(available_detectors())
    with pytest.raises(ConfigError, match=r"gates.safety.detectors.refusal: detector plug-in "
                                          r"'relctl_hostile_exits:Thing' failed to load"):
        detector_group().get("exits", "gates.safety.detectors.refusal")
    with pytest.raises(ConfigError, match="differs from its entry-point name 'misnamed'"):
        detector_group().get("misnamed", "gates.safety.detectors.pii")
