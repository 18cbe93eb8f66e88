"""A `relctl serve` child dies with its parent, however the parent dies (SIGKILL runs no cleanup)."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from release.core.subprocs import start_child, stop_child

PARENT = textwrap.dedent("""
    import json, sys, threading, time
    from pathlib import Path
    from release.serving.process import ServerProcess

    package, work, mode = Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3]
    def start():
        proc = ServerProcess(str(package), work / "srv").start()
        (work / "started.json").write_text(json.dumps({"url": proc.url, "server_pid": proc.pid}))
    if mode == "worker-thread":
        # prctl's parent-death signal follows the starting thread, so it is off here: the pipe watch must act.
        thread = threading.Thread(target=start)
        thread.start()
        thread.join()
    else:
        start()
    time.sleep(600)
""")


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return False
    return state not in ("Z", "X")  # a zombie has exited; only its parent's reaping is left


def port_free(url: str) -> bool:
    host, port = url.removeprefix("http://").split(":")
    with socket.socket() as sock:
        return sock.connect_ex((host, int(port))) != 0


@pytest.mark.parametrize("mode", ["main-thread", "worker-thread"])
def test_server_child_dies_when_its_parent_is_killed(tiny_package: Path, tmp_path: Path, mode: str) -> None:
    script = tmp_path / "parent.py"
    script.write_text(PARENT)
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    parent = subprocess.Popen([sys.executable, str(script), str(tiny_package), str(tmp_path), mode], env=env)
    try:
        deadline = time.monotonic() + 120
        while not (tmp_path / "started.json").is_file():
            assert parent.poll() is None and time.monotonic() < deadline, "the parent never started its server"
            time.sleep(0.05)
        started = json.loads((tmp_path / "started.json").read_text())
        assert alive(started["server_pid"]) and not port_free(started["url"])
        parent.send_signal(signal.SIGKILL)
        parent.wait(10)
        deadline = time.monotonic() + 10
        while alive(started["server_pid"]) or not port_free(started["url"]):
            assert time.monotonic() < deadline, f"server {started['server_pid']} outlived its SIGKILLed parent"
            time.sleep(0.05)
    finally:
        if parent.poll() is None:
            parent.kill()
            parent.wait()
    log = (tmp_path / "srv" / "server.log").read_text()
    assert "relctl serve: stopped by SIGTERM" in log, log


def test_stop_child_ends_the_whole_process_group(tmp_path: Path) -> None:
    # A child that ignores SIGTERM and has a grandchild: both are gone after stop_child's SIGKILL.
    code = ("import signal, subprocess, sys, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
            "p = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)']); "
            "open(sys.argv[1], 'w').write(str(p.pid)); time.sleep(60)")
    marker = tmp_path / "grandchild.pid"
    proc = start_child([sys.executable, "-c", code, str(marker)])
    deadline = time.monotonic() + 30
    while not marker.is_file() or not marker.read_text():
        assert time.monotonic() < deadline
        time.sleep(0.05)
    grandchild = int(marker.read_text())
    assert stop_child(proc, timeout_s=1) == -signal.SIGKILL
    deadline = time.monotonic() + 10
    while alive(grandchild):
        assert time.monotonic() < deadline, "grandchild survived"
        time.sleep(0.05)


def test_finished_children_leave_no_open_pipe_behind() -> None:
    def open_fds() -> int:
        return len(os.listdir("/proc/self/fd"))

    start_child([sys.executable, "-c", "pass"]).wait()
    before = open_fds()
    for _ in range(5):
        assert start_child([sys.executable, "-c", "pass"]).wait() == 0
    assert open_fds() <= before  # each start closes the watch pipes of children already waited for
