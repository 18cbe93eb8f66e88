"""A wake-up timer for the dispatcher with sub-millisecond precision and no busy-waiting.

The event loop's own timers are rounded to whole milliseconds (epoll takes its timeout in ms), so a send
planned 0.3 ms from now would go out up to ~1 ms late. On Linux a timerfd armed at the absolute planned
time wakes the loop's poll within the kernel's timer slack (~50 us), and the loop sleeps in between.
Elsewhere the loop's timer wakes it ~1.1 ms early and the last stretch is spent yielding to the loop.
"""

from __future__ import annotations

import asyncio
import ctypes
import os
import sys
import time
from collections.abc import Callable

CLOCK_MONOTONIC = 1
TFD_TIMER_ABSTIME = 1
TFD_NONBLOCK = 0o4000
TFD_CLOEXEC = 0o2000000
FALLBACK_SPIN_S = 0.0011


class _Timespec(ctypes.Structure):
    _fields_ = [("tv_sec", ctypes.c_long), ("tv_nsec", ctypes.c_long)]


class _Itimerspec(ctypes.Structure):
    _fields_ = [("it_interval", _Timespec), ("it_value", _Timespec)]


def _libc() -> ctypes.CDLL | None:
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.timerfd_create  # noqa: B018 - probe: absent on old or non-glibc systems
        return libc
    except (OSError, AttributeError):
        return None


class WakeTimer:
    """Calls `callback` once `time.perf_counter()` has reached the time given to `arm` (never before).

    One pending wake-up at a time: arming again replaces it. `close()` releases the file descriptor.
    """

    def __init__(self, loop: asyncio.AbstractEventLoop, callback: Callable[[], None]) -> None:
        self._loop = loop
        self._callback = callback
        self._when = 0.0
        self._handle: asyncio.Handle | None = None
        self._fd = -1
        libc = _libc()
        # perf_counter is CLOCK_MONOTONIC on Linux, the clock the timerfd is armed on.
        if libc is not None and time.get_clock_info("perf_counter").implementation.endswith("(CLOCK_MONOTONIC)"):
            fd = libc.timerfd_create(CLOCK_MONOTONIC, TFD_NONBLOCK | TFD_CLOEXEC)
            if fd >= 0:
                self._libc, self._fd = libc, fd
                loop.add_reader(fd, self._on_fd)

    @property
    def precise(self) -> bool:
        """True when a timerfd wakes the loop (no spinning)."""
        return self._fd >= 0

    def arm(self, when: float) -> None:
        self._when = when
        if self._fd >= 0:
            sec = int(when)
            spec = _Itimerspec(_Timespec(0, 0), _Timespec(sec, max(1, int((when - sec) * 1e9))))
            if self._libc.timerfd_settime(self._fd, TFD_TIMER_ABSTIME, ctypes.byref(spec), None) != 0:
                raise OSError(ctypes.get_errno(), "timerfd_settime failed")
            return
        if self._handle is not None:
            self._handle.cancel()
        delay = when - time.perf_counter() - FALLBACK_SPIN_S
        self._handle = self._loop.call_later(delay, self._spin) if delay > 0 else self._loop.call_soon(self._spin)

    def _on_fd(self) -> None:
        try:
            os.read(self._fd, 8)
        except BlockingIOError:  # re-armed after it fired: nothing to read, not due yet
            return
        if time.perf_counter() >= self._when:
            self._callback()

    def _spin(self) -> None:
        if time.perf_counter() >= self._when:
            self._handle = None
            self._callback()
        else:
            self._handle = self._loop.call_soon(self._spin)

    def close(self) -> None:
        if self._handle is not None:
            self._handle.cancel()
        if self._fd >= 0:
            self._loop.remove_reader(self._fd)
            os.close(self._fd)
            self._fd = -1
