"""An adapter's rollback is an alias move plus a switch on the running base (POST /admin/adapters): the base
process keeps serving, only the adapter changes. A base's rollback that would leave production adapters
serving on no base is refused (exit 2, naming them) unless the user says to strand them."""

from __future__ import annotations

import time
from typing import Any

from release.adapters.serving import production_adapters
from release.core.errors import InputError
from release.registry import Registry

STRAND_FLAG = "--strand-adapters"


def refuse_stranding(registry: Registry, model: str, current: str | None, target: str) -> None:
    """InputError when moving `model`'s production from v`current` to v`target` strands adapters built for
    v`current` (their production versions name it as their base)."""
    if current is None or current == target:
        return
    stranded = sorted(production_adapters(registry, model, current))
    if stranded:
        raise InputError(f"{model}: rolling production back from v{current} to v{target} would strand the adapters "
                         f"built for v{current}: {', '.join(stranded)}",
                         hint=f"release them onto v{target} first (relctl promote RUN --onto {model}/{target}), "
                              f"or pass {STRAND_FLAG} to roll back anyway")


def reload_on_server(url: str, model: str, api_key: str | None, timeout_s: float = 120) -> dict[str, Any]:
    """Tell the base server at `url` to serve `model`'s production version now; its answer plus the seconds."""
    import httpx  # noqa: PLC0415

    if not api_key:
        raise InputError("--server: the admin path needs the server's API key",
                         hint="set RELCTL_API_KEY to the key the server was started with")
    started = time.monotonic()
    try:
        response = httpx.post(url.rstrip("/") + "/admin/adapters", json={"model": model}, timeout=timeout_s,
                              headers={"Authorization": f"Bearer {api_key}"})
    except httpx.HTTPError as exc:
        raise InputError(f"--server {url}: {exc}", hint="is relctl serve --adapters running there?") from exc
    if response.status_code != 200:
        raise InputError(f"--server {url}: HTTP {response.status_code}: {response.text[:300]}",
                         hint="the alias moved; load it by hand: POST /admin/adapters {\"model\": ...}")
    answer: dict[str, Any] = response.json()
    answer["round_trip_s"] = round(time.monotonic() - started, 3)
    return answer
