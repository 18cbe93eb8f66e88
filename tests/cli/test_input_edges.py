"""Input a user (or a careless server) can give that was exit 3 or unbounded (issue 40): each is now exit 2 with
its fix, found before anything slow, or bounded and stated. One test per case; docs/guarantees.md lists them."""

from __future__ import annotations

import json
import socket
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from click.testing import CliRunner, Result

from release.backends.variants import parse_variant
from release.cli import cli
from release.config import load_config
from release.core.errors import ConfigError, InputError
from release.gating.plugins import find_gate, validate_block
from release.serving.admin_client import AdminClient, AdminError
from release.serving.loadgen.client import ClientOptions
from release.serving.loadgen.runner import Traffic, sweep
from release.serving.loadgen.summary import SLOs


def relctl(project: Path, *args: str) -> Result:
    return CliRunner().invoke(cli, ["--project-dir", str(project), *args])


@pytest.mark.parametrize("precision", ["int4+", "int4+int8=", "+algo=rtn"])
def test_a_malformed_precision_variant_is_a_config_error_naming_the_grammar(tmp_path: Path, precision: str) -> None:
    with pytest.raises(InputError) as bad:
        parse_variant(precision)
    assert "PRECISION+KEY=VALUE" in (bad.value.hint or "")
    path = tmp_path / "release.yaml"
    path.write_text(f"convert:\n  precision: '{precision}'\n")
    with pytest.raises(ConfigError, match=r"convert.precision: .*is not key=value|nothing before"):
        load_config(path)


@pytest.mark.parametrize("rates", [[0, -1], [0.5, 0]])
def test_sweep_rates_must_be_positive(rates: list[float]) -> None:
    with pytest.raises(ConfigError, match=r"gates.load.sweep_rates.\d+: Input should be greater than 0"):
        validate_block(find_gate("load"), {"sweep": True, "sweep_rates": rates})


def test_a_sweep_that_would_send_for_hours_is_refused_naming_its_cap() -> None:
    with pytest.raises(ConfigError, match=r"sends for 20000s, over max_duration_s 900s .*rate 0.001") as refused:
        validate_block(find_gate("load"), {"sweep": True, "sweep_rates": [0.001], "step_duration_s": 2})
    assert "max_duration_s" in refused.value.message
    gate = find_gate("load")(validate_block(find_gate("load"), {"sweep": True, "sweep_rates": [1, 2]}))  # type: ignore[call-arg]
    assert gate.bounds() == ["gates.load: the sweep sends for at most 900s (gates.load.max_duration_s); its "
                             "sweep_rates send for 30s"]


def test_a_doubling_sweep_starts_no_step_past_its_cap() -> None:
    # The endpoint is never contacted: the first step (20 requests at 0.01/s: 2000 s) would end past the cap.
    opts = ClientOptions(base_url="http://127.0.0.1:9", model="m")
    result = sweep(opts, Traffic(rate=0.01, requests=20), SLOs(), step_duration_s=2, max_duration_s=60)
    assert result.steps == [] and result.stopped is not None and "max_duration_s 60s" in result.stopped


def test_serve_on_a_busy_port_is_exit_2_naming_the_port_before_anything_loads(project_dir: Path) -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        # No such model either: the port is what is refused, so it was checked before the model was looked up.
        result = relctl(project_dir, "serve", "no-such-model@production", "--port", str(port))
    assert result.exit_code == 2, result.output
    assert f"error: port {port} on 127.0.0.1 is already in use" in result.stderr
    assert "--port" in result.stderr.splitlines()[-1] and "Traceback" not in result.output


def test_keygen_refuses_a_dangling_symlink_where_the_private_key_goes(project_dir: Path, tmp_path: Path) -> None:
    keys = project_dir / ".relctl" / "keys"
    keys.mkdir(parents=True)
    (keys / "release.pem").symlink_to(tmp_path / "gone" / "release.pem")
    result = relctl(project_dir, "keygen")
    assert result.exit_code == 2, result.output
    assert "release.pem is a symlink to" in result.stderr and "does not exist" in result.stderr
    assert result.stderr.splitlines()[-1].startswith("hint: remove the link")
    assert not (project_dir / "keys" / "release.pub").exists()   # nothing half-written


class _Answers(BaseHTTPRequestHandler):
    body = b"{}"

    def do_GET(self) -> None:
        self.send_response(200)
        self.send_header("content-type", "application/json")
        self.end_headers()
        self.wfile.write(self.body)

    def log_message(self, *args: object) -> None:
        del args


@pytest.fixture()
def server_answering() -> Iterator[ThreadingHTTPServer]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Answers)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server
    server.shutdown()
    server.server_close()


@pytest.mark.parametrize(("answer", "names"), [({"adapters": 5}, "'adapters' is int, not a list"),
                                               ({"base": None}, "'adapters' is missing"),
                                               ({"adapters": [1]}, "not an object"),
                                               ({"adapters": [], "base": "x"}, "'base' is str")])
def test_an_adapter_listing_of_another_shape_is_an_admin_error_naming_the_field(
        server_answering: ThreadingHTTPServer, answer: object, names: str) -> None:
    _Answers.body = json.dumps(answer).encode()
    host, port = server_answering.server_address[:2]
    with pytest.raises(AdminError, match=names) as refused:
        AdminClient.of(f"http://{host!s}:{port}", "admin-key").listing()
    assert refused.value.exit_code == 4 and "relctl serve BASE@production --adapters" in (refused.value.hint or "")


@pytest.mark.parametrize("answer", [{"data": 5}, {"data": {"id": "m"}}, [1, 2]])
def test_a_models_listing_of_another_shape_states_nothing(server_answering: ThreadingHTTPServer,
                                                           answer: object) -> None:
    """GET /v1/models answered with another shape: bench treats the endpoint as stating no model or context
    (--model then names it), instead of exit 3."""
    from release.serving.loadgen.context import discover

    _Answers.body = json.dumps(answer).encode()
    host, port = server_answering.server_address[:2]
    if isinstance(answer, list):
        with pytest.raises(InputError, match="cannot list models"):
            discover(f"http://{host!s}:{port}")
        return
    info = discover(f"http://{host!s}:{port}")
    assert (info.model, info.max_model_len) == (None, None)
