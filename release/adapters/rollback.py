"""An adapter's rollback is an alias move plus a switch on the running base (POST /admin/adapters): the base
process keeps serving, only the adapter changes. A base's rollback that would leave production adapters
serving on no base is refused (exit 2, naming them) unless the user says to strand them."""

from __future__ import annotations

from typing import Any

from release.adapters.trust import production_adapters
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


def reload_on_server(url: str, model: str, admin_key: str | None = None, timeout_s: float = 120) -> dict[str, Any]:
    """Tell the base server at `url` to serve `model`'s production version now (its admin key: `admin_key`,
    else RELCTL_ADMIN_KEY); its answer plus the round trip's seconds."""
    from release.serving.admin_client import AdminClient, AdminError  # noqa: PLC0415 - httpx: only with --server

    client = AdminClient.of(url, admin_key, timeout_s=timeout_s)
    try:
        return client.switch(model)
    except AdminError as exc:
        raise InputError(exc.message, hint="the alias moved; load it by hand: POST /admin/adapters "
                                           "{\"model\": ...} with the admin key") from exc
