"""Bounded talk to an OCI registry: every read has a size bound taken from what was pinned, every request
a deadline, and every failure one line naming the host and what relctl waited for.

oras-py (the push, token auth from the Docker config) sends requests with no timeout, reads answers whole
and retries a 500 five times over two minutes. Here a `BoundedRegistry` is oras's client with:
- a per-operation deadline (`RELCTL_OCI_TIMEOUT_S`, 60 s; a blob also gets `size / RELCTL_OCI_MIN_RATE`,
  1 MiB/s): each socket wait is cut to what is left of it, and a timer shuts the sockets down when it passes
  (status line, headers, body, an upload), so a registry that stalls after `/v2/`, sends its headers a byte
  at a time or reads an upload a byte at a time ends in exit 4 naming the host and the request, not a hang;
- no retries: a registry that answers 5xx is reported at once (exit 4, "the registry failed"), with a hint
  about the registry, never about credentials;
- bounded reads: a manifest is read up to `RELCTL_OCI_MAX_MANIFEST_BYTES` (4 MiB, the distribution spec's
  limit registries accept), a blob up to the size its descriptor pins; more is refused unread (exit 2, the
  registry serves other bytes than were published).
"""

from __future__ import annotations

import contextlib
import hashlib
import http.cookiejar
import os
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import oras.provider
import requests
import requests.adapters
import urllib3
import urllib3.connection

from release.core.errors import InputError, RegistryError

MAX_MANIFEST_BYTES = 4 * 1024 * 1024
CHUNK = 1024 * 1024


def _env_float(name: str, default: float) -> float:
    raw = os.environ.get(name)
    try:
        value = float(raw) if raw else default
    except ValueError:
        raise InputError(f"{name}={raw}: not a number", hint=f"unset it for the default ({default:g})") from None
    if value <= 0:
        raise InputError(f"{name}={raw}: must be positive", hint=f"unset it for the default ({default:g})")
    return value


def timeout_s() -> float:
    """Seconds one registry operation may take (a blob gets more, by its size)."""
    return _env_float("RELCTL_OCI_TIMEOUT_S", 60.0)


def min_rate() -> float:
    """Bytes per second a blob transfer must keep up on average (its deadline grows with its size)."""
    return _env_float("RELCTL_OCI_MIN_RATE", 1024.0 * 1024.0)


def max_manifest_bytes() -> int:
    return int(_env_float("RELCTL_OCI_MAX_MANIFEST_BYTES", MAX_MANIFEST_BYTES))


class _Deadline:
    """The operation in progress: what it waits for and when it must be done."""

    def __init__(self) -> None:
        self.what = "the registry"
        self.until = time.monotonic() + timeout_s()
        self.seconds = timeout_s()

    def left(self) -> float:
        return self.until - time.monotonic()


def _tracking_adapter(sockets: set[socket.socket]) -> requests.adapters.HTTPAdapter:
    """An adapter whose connections record their sockets in `sockets`, so a timer can cut them off."""

    class Tracked(urllib3.connection.HTTPConnection):
        def connect(self) -> None:
            super().connect()
            sockets.add(self.sock)

    class TrackedTLS(urllib3.connection.HTTPSConnection):
        def connect(self) -> None:
            super().connect()
            sockets.add(self.sock)

    class Pool(urllib3.HTTPConnectionPool):
        ConnectionCls = Tracked

    class TLSPool(urllib3.HTTPSConnectionPool):
        ConnectionCls = TrackedTLS

    adapter = requests.adapters.HTTPAdapter(max_retries=0)
    adapter.poolmanager.pool_classes_by_scheme = {"http": Pool, "https": TLSPool}
    return adapter


class _BoundedSession(requests.Session):
    """Every request of oras (auth token fetches too) bounded by what is left of the operation's deadline: the
    socket timeout bounds each wait, and a timer shuts the request's sockets down when the deadline passes, so
    a registry that sends its status and headers a byte at a time, or reads an upload a byte at a time (each
    socket operation quick, the whole endless), cannot outlast it either."""

    def __init__(self, host: str, deadline: _Deadline) -> None:
        super().__init__()
        self.host = host
        self.deadline = deadline
        self.sockets: set[socket.socket] = set()
        adapter = _tracking_adapter(self.sockets)
        self.mount("http://", adapter)
        self.mount("https://", adapter)

    def cut_off(self) -> None:
        """Shut down every socket of this session (from a timer thread: unblocks a read or a send in progress)."""
        for sock in list(self.sockets):
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
        self.sockets.clear()

    def request(self, method: str | bytes, url: str | bytes, *args: Any, **kwargs: Any) -> requests.Response:
        left = self.deadline.left()
        if left <= 0:
            raise stalled(self.host, self.deadline)
        kwargs["timeout"] = (min(left, 10.0), left)
        watchdog = threading.Timer(left, self.cut_off)
        watchdog.daemon = True
        watchdog.start()
        try:
            return super().request(method, url, *args, **kwargs)  # type: ignore[arg-type]
        except requests.exceptions.Timeout as exc:
            raise stalled(self.host, self.deadline) from exc
        except (requests.exceptions.RequestException, urllib3.exceptions.HTTPError, OSError) as exc:
            if self.deadline.left() <= 0:   # cut off by the watchdog
                raise stalled(self.host, self.deadline) from exc
            raise
        finally:
            watchdog.cancel()


def stalled(host: str, deadline: _Deadline) -> RegistryError:
    return RegistryError(f"the OCI registry {host} did not answer {deadline.what} within {deadline.seconds:.0f} s",
                         hint="the registry is stalled or overloaded; check it, then run the command again "
                              "(RELCTL_OCI_TIMEOUT_S raises the limit)")


class BoundedRegistry(oras.provider.Registry):  # type: ignore[misc]
    """oras's client with deadlines, no retries and bounded reads (see the module's docstring)."""

    def __init__(self, hostname: str, insecure: bool) -> None:
        super().__init__(hostname=hostname, insecure=insecure)
        self.deadline = _Deadline()
        session = _BoundedSession(hostname, self.deadline)
        session.cookies.set_policy(http.cookiejar.DefaultCookiePolicy(allowed_domains=[]))  # as oras: no cookies
        self.session = session
        self.auth.session = session   # token requests too

    def do_request(self, url: str, method: str = "GET", data: Any = None, headers: dict[str, str] | None = None,
                   json: Any = None, stream: bool = False) -> requests.Response:
        # oras's own do_request without its retry decorator: five retries of a 500 over two minutes are
        # not what a CI job or an init container should wait for.
        undecorated = oras.provider.Registry.do_request.__wrapped__
        return undecorated(self, url, method, data, dict(headers or {}), json, stream)  # type: ignore[no-any-return]

    @contextlib.contextmanager
    def operation(self, what: str, extra_s: float = 0.0) -> Iterator[None]:
        """Run one operation (`what`: how an error names it) under its own deadline."""
        seconds = timeout_s() + extra_s
        self.deadline.what, self.deadline.seconds = what, seconds
        self.deadline.until = time.monotonic() + seconds
        try:
            yield
        except requests.exceptions.Timeout as exc:
            raise stalled(self.hostname, self.deadline) from exc
        except (requests.exceptions.RequestException, urllib3.exceptions.HTTPError) as exc:
            if self.deadline.left() <= 0:
                raise stalled(self.hostname, self.deadline) from exc
            raise RegistryError(f"the OCI registry {self.hostname} failed during {what}: {exc}",
                                hint="check the host and that the registry is up") from exc

    def _body(self, response: requests.Response) -> Iterator[bytes]:
        """The raw body (no Content-Encoding decoding: a bound on bytes must be a bound on memory), cut off at
        the deadline: a registry that trickles a byte at a time cannot outlast it (urllib3's shutdown()
        unblocks the read from a timer thread)."""
        def cut() -> None:
            with contextlib.suppress(OSError):   # the connection may be closed already
                response.raw.shutdown()

        watchdog = threading.Timer(max(self.deadline.left(), 0.0), cut)
        watchdog.daemon = True
        watchdog.start()
        try:
            yield from response.raw.stream(CHUNK, decode_content=False)
        except Exception as exc:
            if self.deadline.left() <= 0:
                raise stalled(self.hostname, self.deadline) from exc
            raise
        finally:
            watchdog.cancel()
        if self.deadline.left() <= 0:   # cut off by the watchdog: what was read is not the whole body
            raise stalled(self.hostname, self.deadline)

    def read_bounded(self, url: str, what: str, limit: int, accept: str | None = None) -> bytes:
        """GET `url`, at most `limit` bytes (more is refused unread); the status checked."""
        with self.operation(what):
            response = self.do_request(url, "GET", headers={"Accept": accept} if accept else None, stream=True)
            with response:
                check_status(response, what, self.hostname)
                declared = response.headers.get("Content-Length", "")
                if declared.isdigit() and int(declared) > limit:
                    raise oversized(self.hostname, what, limit)
                chunks, size = [], 0
                for chunk in self._body(response):
                    size += len(chunk)
                    if size > limit:
                        raise oversized(self.hostname, what, limit)
                    chunks.append(chunk)
        return b"".join(chunks)

    def download_bounded(self, url: str, what: str, size: int, digest: str, path: Path) -> None:
        """GET the blob at `url` into `path`: exactly `size` bytes hashing to `digest`, or InputError."""
        with self.operation(what, extra_s=size / min_rate()):
            response = self.do_request(url, "GET", stream=True)
            with response, path.open("wb") as fh:
                check_status(response, what, self.hostname)
                declared = response.headers.get("Content-Length", "")
                if declared.isdigit() and int(declared) > size:
                    raise oversized(self.hostname, what, size)
                sha, got = hashlib.sha256(), 0
                for chunk in self._body(response):
                    got += len(chunk)
                    if got > size:
                        raise oversized(self.hostname, what, size)
                    sha.update(chunk)
                    fh.write(chunk)
        if got != size or "sha256:" + sha.hexdigest() != digest:
            raise InputError(f"{what} does not match its digest ({got} bytes read; {digest}, {size} bytes, pinned)",
                             hint="the registry is serving other bytes than were published; do not deploy them")


def oversized(host: str, what: str, limit: int) -> InputError:
    return InputError(f"{what}: the registry {host} answered more than the {limit} bytes pinned for it",
                      hint="the registry is serving other bytes than were published; do not deploy them")


def check_status(response: Any, what: str, host: str, pushing: bool = False) -> None:
    """A hint for each kind of refusal: credentials only where they are the problem."""
    status = int(response.status_code)
    if status in (200, 201, 202):
        return
    detail = f"{what}: the registry {host} answered {status}"
    if status in (401, 403):
        raise RegistryError(detail, hint="check that you may push to it (docker login)" if pushing else
                            "the pull uses no credentials: the repository must be readable anonymously")
    if status == 404:
        raise RegistryError(detail + " (not found)", hint="check the repository name and the digest")
    if status == 429:
        raise RegistryError(detail + " (rate limited)", hint="wait, then run the command again")
    if status >= 500:
        raise RegistryError(detail + " (a registry error)", hint="the registry failed; check it, then run the "
                                                                 "command again")
    raise RegistryError(detail, hint="check the repository name and the reference")
