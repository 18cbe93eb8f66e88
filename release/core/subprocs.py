"""Child processes that die with their parent: `relctl serve` under the load gate, convert's builder.

A SIGKILLed parent runs no cleanup code, so the child must notice by itself. Two mechanisms, both on:
- Linux: `prctl(PR_SET_PDEATHSIG, SIGTERM)` in the child before exec, so the kernel sends SIGTERM when
  the parent dies. The kernel ties it to the parent *thread* that started the child, so it is set only
  when starting from the main thread (a worker thread ending must not stop a server it started).
- everywhere: a pipe whose write end only the parent holds. A relctl child that calls `watch_parent()`
  (release.serving's entry point does) sees end-of-file when the parent is gone, however it died, and
  stops itself with SIGTERM (a server drains first).
Each child also gets its own session and process group, so a terminal's Ctrl-C reaches the parent
only (which stops the child in order), and `stop_child` can signal everything the child started.
"""

from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Callable, Mapping, Sequence
from typing import IO, Any

PARENT_PIPE_ENV = "RELCTL_PARENT_PIPE"
PR_SET_PDEATHSIG = 1

# Write ends of the parent-watch pipes, by child pid: closing one tells that child its parent is gone.
# Pipes of children already waited for are closed at the next start_child (or by stop_child).
_watch_pipes: dict[int, tuple[subprocess.Popen[bytes], int]] = {}
_lock = threading.Lock()

FileArg = int | IO[Any] | None


def start_child(cmd: Sequence[str], *, stdout: FileArg = None, stderr: FileArg = None,
                stdin: FileArg = subprocess.DEVNULL, env: Mapping[str, str] | None = None,
                cwd: str | os.PathLike[str] | None = None) -> subprocess.Popen[bytes]:
    """Start `cmd` as a child that is terminated (SIGTERM) when this process dies, even by SIGKILL.

    Wait for it with the returned Popen as usual; `stop_child` ends it (and its process group) early.
    """
    _close_finished()
    read_end, write_end = os.pipe()
    child_env = {**(os.environ if env is None else env), PARENT_PIPE_ENV: str(read_end)}
    parent_pid = os.getpid()
    prctl = _prctl() if threading.current_thread() is threading.main_thread() else None
    preexec = (lambda: _die_with(prctl, parent_pid)) if prctl is not None else None
    try:
        # preexec_fn runs between fork and exec; it only makes one libc call, resolved before the fork,
        # so it takes no lock another thread could hold.
        proc = subprocess.Popen(list(cmd), stdout=stdout, stderr=stderr, stdin=stdin, env=child_env, cwd=cwd,
                                pass_fds=(read_end,), start_new_session=True,
                                preexec_fn=preexec)
    except BaseException:
        os.close(write_end)
        raise
    finally:
        os.close(read_end)
    with _lock:
        _watch_pipes[proc.pid] = (proc, write_end)
    return proc


def _prctl() -> Any:
    """libc's prctl on Linux, else None."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        return ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None


def _die_with(prctl: Any, parent_pid: int) -> None:
    """Runs in the child between fork and exec: ask for SIGTERM when the parent dies."""
    prctl(PR_SET_PDEATHSIG, int(signal.SIGTERM), 0, 0, 0)
    if os.getppid() != parent_pid:  # the parent died before prctl took effect
        os._exit(1)


def stop_child(proc: subprocess.Popen[bytes], timeout_s: float = 60.0) -> int:
    """SIGTERM to the child's process group, wait up to `timeout_s`, then SIGKILL the group; exit code."""
    try:
        if proc.poll() is None:
            _signal_group(proc, signal.SIGTERM)
            try:
                return proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                _signal_group(proc, signal.SIGKILL)
        return proc.wait()
    finally:
        # Only now: the child reads end-of-file as "parent gone" and would signal itself once more.
        _close_watch(proc.pid)


def _signal_group(proc: subprocess.Popen[bytes], sig: signal.Signals) -> None:
    try:
        os.killpg(proc.pid, sig)  # start_new_session: the child leads its own group
    except (ProcessLookupError, PermissionError):
        try:
            proc.send_signal(sig)
        except ProcessLookupError:
            pass


def _close_watch(pid: int) -> None:
    with _lock:
        entry = _watch_pipes.pop(pid, None)
    if entry is not None:
        os.close(entry[1])


def _close_finished() -> None:
    with _lock:
        done = [pid for pid, (proc, _) in _watch_pipes.items() if proc.returncode is not None]
    for pid in done:
        _close_watch(pid)


def watch_parent(on_parent_gone: Callable[[], None] | None = None) -> bool:
    """In a child started by `start_child`: run `on_parent_gone` (default: SIGTERM to itself) once the
    parent is gone. Returns False when this process was not started that way (nothing to watch)."""
    value = os.environ.pop(PARENT_PIPE_ENV, None)
    if value is None or not value.isdigit():
        return False
    fd = int(value)
    try:
        os.fstat(fd)
    except OSError:
        return False
    action = on_parent_gone or (lambda: os.kill(os.getpid(), signal.SIGTERM))

    def watch() -> None:
        while True:
            try:
                if not os.read(fd, 1):
                    break
            except InterruptedError:
                continue
            except OSError:
                break
        action()

    threading.Thread(target=watch, name="relctl-parent-watch", daemon=True).start()
    return True
