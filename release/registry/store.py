"""Where MLflow lives: the embedded SQLite store under the project folder, or MLFLOW_TRACKING_URI.

MLflow's own defaults depend on the current directory (./mlruns) and wait minutes on a dead server
(120 s per request, 7 retries); relctl never relies on them. It always sets the tracking URI, the
registry URI and each experiment's artifact location explicitly, and for a tracking server it sets
MLflow's HTTP timeout and retries and probes the server once before any work:

- `RELCTL_REGISTRY_TIMEOUT_S` (default 30): seconds per HTTP request (connect, and each wait for data),
  and the whole budget of the probe at connect, which never retries.
- `RELCTL_REGISTRY_RETRIES` (default 3) and `RELCTL_REGISTRY_BACKOFF_S` (default 1: waits 1, 2, 4 s):
  MLflow's retries of connection failures and of 408/429/5xx answers.
  MLflow's own `MLFLOW_HTTP_REQUEST_TIMEOUT`, `..._MAX_RETRIES`, `..._BACKOFF_FACTOR` are honoured when
  set and the relctl variable is not.
- `RELCTL_ARTIFACT_ROOT`: where experiments relctl creates keep artifacts when MLFLOW_TRACKING_URI is a
  database (postgresql://, mysql://, mssql://, sqlite://); default: the project's `.relctl/artifacts/`.
  A tracking server picks its own (`--artifacts-destination`) unless this is set.

URIs shown to people go through `redact_uri`: credentials never reach a message, log or tag.
"""

from __future__ import annotations

import os
import socket
import time
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

from release.core.errors import ConfigError, InputError, RegistryError

STATE_DIR = ".relctl"
TIMEOUT_ENV = "RELCTL_REGISTRY_TIMEOUT_S"
RETRIES_ENV = "RELCTL_REGISTRY_RETRIES"
BACKOFF_ENV = "RELCTL_REGISTRY_BACKOFF_S"
ARTIFACT_ROOT_ENV = "RELCTL_ARTIFACT_ROOT"
DEFAULT_TIMEOUT_S = 30
DEFAULT_RETRIES = 3
DEFAULT_BACKOFF_S = 1
# (relctl variable, MLflow variable, default, lowest, highest); MLflow refuses more than 10 retries
# and a backoff factor over 120, and parses all three as integers.
_HTTP_SETTINGS = (
    (TIMEOUT_ENV, "MLFLOW_HTTP_REQUEST_TIMEOUT", DEFAULT_TIMEOUT_S, 1, 3600),
    (RETRIES_ENV, "MLFLOW_HTTP_REQUEST_MAX_RETRIES", DEFAULT_RETRIES, 0, 10),
    (BACKOFF_ENV, "MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR", DEFAULT_BACKOFF_S, 0, 120),
)
DATABASE_SCHEMES = ("postgresql", "mysql", "mssql", "sqlite")
SERVER_SCHEMES = ("http", "https")
_DEFAULT_DB_PORTS = {"postgresql": 5432, "mysql": 3306, "mssql": 1433}
_SECRET_QUERY_WORDS = ("pass", "pwd", "token", "secret", "key", "auth", "credential")
HINT = (
    "check MLFLOW_TRACKING_URI, that the server is running and reachable from here, and its credentials "
    f"(MLFLOW_TRACKING_TOKEN or MLFLOW_TRACKING_USERNAME/PASSWORD); {TIMEOUT_ENV} sets the timeout"
)


def redact_uri(uri: str) -> str:
    """`uri` without user, password and secret-looking query values: the form safe to print or tag."""
    try:
        parts = urlsplit(uri)
    except ValueError:
        return "<unparseable URI>"
    netloc = parts.netloc.rpartition("@")[2]
    query = urlencode([(k, "***" if any(w in k.lower() for w in _SECRET_QUERY_WORDS) else v)
                       for k, v in parse_qsl(parts.query, keep_blank_values=True)])
    if not parts.netloc and "://" in uri:
        # urlunsplit drops an empty authority: sqlite:////abs/path would print as sqlite://abs/path and
        # sqlite:///rel.db as sqlite:/rel.db, other addresses; with no authority there is no credential.
        rest = parts.path + (f"?{query}" if query else "") + (f"#{parts.fragment}" if parts.fragment else "")
        return f"{parts.scheme}://{rest}"
    return urlunsplit((parts.scheme, netloc, parts.path, query, parts.fragment))


def _scheme(uri: str) -> str:
    # SQLAlchemy URIs name a driver after '+': postgresql+psycopg2://
    return uri.partition("://")[0].partition("+")[0].lower() if "://" in uri else ""


@dataclass(frozen=True)
class Store:
    tracking_uri: str
    # Artifact root for experiments relctl creates; None lets a tracking server choose (--default-artifact-root).
    artifact_root: str | None
    embedded: bool
    timeout_s: int = DEFAULT_TIMEOUT_S
    retries: int = DEFAULT_RETRIES
    backoff_s: int = DEFAULT_BACKOFF_S
    # The project folder the store was resolved for: where MLflow's own defaults would have put a run.
    project_dir: str = ""

    @property
    def is_server(self) -> bool:
        """An MLflow tracking server reached over HTTP(S)."""
        return _scheme(self.tracking_uri) in SERVER_SCHEMES

    @property
    def is_database(self) -> bool:
        """A database MLflow opens in-process (the embedded store is one: SQLite)."""
        return _scheme(self.tracking_uri) in DATABASE_SCHEMES

    @property
    def display_uri(self) -> str:
        """The tracking URI without credentials, for messages, logs and tags."""
        return redact_uri(self.tracking_uri)

    def artifact_location(self, experiment_name: str) -> str | None:
        if self.artifact_root is None:
            return None
        safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in experiment_name)
        return f"{self.artifact_root}/{safe}"


def _setting(env: os._Environ[str] | dict[str, str], name: str, mlflow_name: str, default: int,
             low: int, high: int) -> int:
    source = name if env.get(name) else mlflow_name if env.get(mlflow_name) else None
    if source is None:
        return default
    raw = env[source].strip()
    try:
        value = int(raw)
    except ValueError:
        value = low - 1
    if not low <= value <= high:
        raise ConfigError(f"{source}={raw!r} is not a whole number from {low} to {high}",
                          hint=f"set {source} to an integer, e.g. {source}={default}, or unset it")
    return value


def _artifact_root(env: os._Environ[str] | dict[str, str], state: Path) -> str:
    root = env.get(ARTIFACT_ROOT_ENV, "").strip()
    if not root:
        return (state / "artifacts").as_uri()
    if "://" in root or root.startswith(("file:", "s3:", "gs:", "wasbs:")):
        return root.rstrip("/")
    # A bare path is made absolute now, so it never depends on where a later command runs.
    return Path(root).expanduser().resolve().as_uri()


def resolve_store(project_dir: Path, environ: dict[str, str] | None = None) -> Store:
    """The store for `project_dir`: MLFLOW_TRACKING_URI when set, else the embedded SQLite store."""
    env = os.environ if environ is None else environ
    timeout, retries, backoff = (_setting(env, *s) for s in _HTTP_SETTINGS)
    state = (project_dir / STATE_DIR).resolve()
    uri = env.get("MLFLOW_TRACKING_URI")
    if uri:
        database = _scheme(uri) in DATABASE_SCHEMES
        root = _artifact_root(env, state) if database or env.get(ARTIFACT_ROOT_ENV, "").strip() else None
        return Store(uri, root, False, timeout, retries, backoff, str(project_dir.resolve()))
    return Store(f"sqlite:///{state / 'mlflow.db'}", (state / "artifacts").as_uri(), True, timeout, retries, backoff,
                 str(project_dir.resolve()))


def local_store_path(store: Store) -> Path | None:
    """The file or folder a local store lives in (sqlite:///…, file:…, a bare path); None for a server or a
    database server."""
    uri = store.tracking_uri
    scheme = _scheme(uri)
    if scheme == "sqlite":
        # sqlite:///relative.db and sqlite:////absolute.db; a query (?mode=ro) is not part of the path
        return Path(uri.partition(":///")[2].partition("?")[0] or ":memory:")
    if scheme == "file" or (not scheme and uri):
        return Path(urlsplit(uri).path if scheme else uri)
    return None


def require_existing(store: Store) -> None:
    """For a read-only command: refuse a local store that does not exist instead of creating an empty one.

    MLflow creates a SQLite file (and its schema) on first contact, so a mistyped MLFLOW_TRACKING_URI would
    otherwise answer "not found" from a fresh empty database and leave that file behind.
    """
    path = local_store_path(store)
    if path is None or str(path) == ":memory:" or path.exists():
        return
    if store.embedded:
        message = f"no MLflow store at {path}: nothing has been logged or released in this project yet"
    else:
        message = f"MLFLOW_TRACKING_URI {store.display_uri} names no existing store ({path} does not exist)"
    raise InputError(message, hint=stray_store_hint(store) or (
        "check MLFLOW_TRACKING_URI (a read-only command never creates a store), or pass the --project-dir "
        "whose .relctl/ holds the store"))


def stray_store_hint(store: Store) -> str | None:
    """When the project folder holds a store of MLflow's own defaults (./mlflow.db, ./mlruns: where a run
    logged with no MLFLOW_TRACKING_URI lands) that relctl is not reading, how to point relctl at it."""
    if not store.project_dir:
        return None
    here = Path(store.project_dir)
    used = local_store_path(store)
    for candidate, uri in ((here / "mlflow.db", f"sqlite:///{here / 'mlflow.db'}"),
                           (here / "mlruns", (here / "mlruns").as_uri())):
        if candidate.exists() and (used is None or candidate.resolve() != used.resolve()):
            if candidate.name == "mlruns" and (here / "mlflow.db").exists():
                continue  # MLflow 3 keeps artifacts in ./mlruns beside ./mlflow.db: the db is the store
            return (f"the run may be in {candidate} (MLflow's default store when MLFLOW_TRACKING_URI is unset); "
                    f"point relctl at it: export MLFLOW_TRACKING_URI={uri} (or log runs where relctl reads "
                    "them: the MLFLOW_TRACKING_URI that `relctl init` prints)")
    return None


def connect(store: Store) -> None:
    """Point the mlflow module at `store` (tracking and registry both, explicitly) after checking it answers.

    Raises RegistryError (exit 4) within `store.timeout_s` when a server or database cannot be reached;
    nothing is written before that.
    """
    import mlflow  # noqa: PLC0415 - MLflow takes seconds to import; resolve_store() and the CLI's start-up need none of it

    if store.is_server:
        _apply_http_settings(store)
        probe_server(store)
    elif store.is_database and not store.embedded:
        probe_database(store)
    if store.embedded:
        db_path = Path(store.tracking_uri.removeprefix("sqlite:///"))
        db_path.parent.mkdir(parents=True, exist_ok=True)
    # mlflow.set_*_uri also export MLFLOW_TRACKING_URI/MLFLOW_REGISTRY_URI into os.environ; that would
    # make the next resolve_store() mistake relctl's own choice for the user's. MLflow's module-level
    # URI wins over the variable, so restoring the environment keeps both right.
    saved = {k: os.environ.get(k) for k in ("MLFLOW_TRACKING_URI", "MLFLOW_REGISTRY_URI")}
    mlflow.set_tracking_uri(store.tracking_uri)
    mlflow.set_registry_uri(store.tracking_uri)
    for key, value in saved.items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value
    if store.is_database:
        _initialize_database(store)


def _apply_http_settings(store: Store) -> None:
    # MLflow reads these at every request; the environment is its only switch for MlflowClient.
    values = (store.timeout_s, store.retries, store.backoff_s)
    for (_, mlflow_name, *_), value in zip(_HTTP_SETTINGS, values, strict=True):
        os.environ[mlflow_name] = str(value)
    if store.display_uri != store.tracking_uri:
        # MLflow prints "View run at <tracking URI>" when a run ends: not with credentials in that URI.
        os.environ["MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT"] = "true"


def probe_server(store: Store) -> None:
    """One GET to the tracking API, no retries, `store.timeout_s` at most: reachable and credentials accepted."""
    from mlflow.utils.credentials import get_default_host_creds  # noqa: PLC0415 - as in connect()
    from mlflow.utils.rest_utils import http_request  # noqa: PLC0415 - as in connect()

    where = f"tracking server {store.display_uri}"
    started = time.monotonic()
    try:
        # MLflow's own request path, so tokens, basic auth, TLS settings and auth plugins apply as usual
        # (its helpers are unannotated, hence the ignores).
        creds = get_default_host_creds(store.tracking_uri)  # type: ignore[no-untyped-call]
        response = http_request(  # type: ignore[no-untyped-call]
            creds, "/api/2.0/mlflow/experiments/search", "GET", max_retries=0, backoff_factor=0,
            timeout=store.timeout_s, raise_on_status=False, params={"max_results": 1},
        )
    except Exception as exc:  # every transport failure means the same thing to the user
        raise RegistryError(f"{where} {_transport_failure(exc, time.monotonic() - started, store)}",
                            hint=HINT) from None
    if response.status_code in (401, 403):
        raise RegistryError(f"{where} rejected the credentials (HTTP {response.status_code})", hint=HINT)
    if not response.ok:
        raise RegistryError(f"{where} answered HTTP {response.status_code} to an experiments search, "
                            "so it is not a working MLflow tracking server", hint=HINT)


def _transport_failure(exc: BaseException, elapsed: float, store: Store) -> str:
    chain: list[BaseException] = []
    current: BaseException | None = exc
    while current is not None and len(chain) < 10:
        chain.append(current)
        current = current.__cause__ or current.__context__
    text = " ".join(f"{type(e).__name__} {e}" for e in chain).lower()
    if "refused" in text:
        return "refused the connection (nothing listens there)"
    if "timeout" in text or "timed out" in text or elapsed >= store.timeout_s * 0.9:
        return f"did not answer within {store.timeout_s} s"
    if "name or service not known" in text or "nodename nor servname" in text or "resolution" in text:
        return "has a host name that does not resolve"
    return f"cannot be reached ({type(chain[-1]).__name__})"


def probe_database(store: Store) -> None:
    """Reach the database host and log in once, within `store.timeout_s`.

    MLflow's own engine creation retries ten times over about 100 s, even for a wrong password.
    """
    scheme = _scheme(store.tracking_uri)
    if scheme not in _DEFAULT_DB_PORTS:
        return  # sqlite: a local file
    parts = urlsplit(store.tracking_uri)
    try:
        host, port = parts.hostname or "localhost", parts.port or _DEFAULT_DB_PORTS[scheme]
    except ValueError as exc:
        raise ConfigError(f"MLFLOW_TRACKING_URI {store.display_uri}: {exc}",
                          hint="write it as postgresql://USER:PASSWORD@HOST:PORT/DATABASE") from None
    try:
        socket.create_connection((host, port), timeout=store.timeout_s).close()
    except OSError as exc:
        reason = "refused the connection" if isinstance(exc, ConnectionRefusedError) else (
            f"did not answer within {store.timeout_s} s" if isinstance(exc, TimeoutError) else str(exc))
        raise RegistryError(f"database {store.display_uri} {reason}", hint=HINT) from None
    if scheme in ("postgresql", "mysql"):
        import sqlalchemy  # noqa: PLC0415 - only for a database URI, which few commands use
        from sqlalchemy.pool import NullPool  # noqa: PLC0415 - as above

        engine = sqlalchemy.create_engine(store.tracking_uri, poolclass=NullPool,
                                          connect_args={"connect_timeout": store.timeout_s})
        try:
            engine.connect().close()
        except Exception as exc:  # login refused, database missing, driver missing
            raise RegistryError(f"database {store.display_uri}: {_first_line(exc, store)}", hint=HINT) from None
        finally:
            engine.dispose()


def _first_line(exc: BaseException, store: Store) -> str:
    """The driver's own first line, with the URI's password taken out should a driver echo it."""
    text = (str(getattr(exc, "orig", None) or exc).strip().splitlines() or [type(exc).__name__])[0]
    password = urlsplit(store.tracking_uri).password
    return text.replace(password, "***") if password else text


def _initialize_database(store: Store) -> None:
    # The first store opened on an empty database creates the Default experiment with that store's
    # artifact root; MlflowClient would pass none and MLflow would use ./mlruns of the current
    # directory. Opening it once with relctl's root first makes even that location explicit.
    # Engines are cached per URI, so the MlflowClient opened next reuses this connection pool.
    if store.embedded and Path(store.tracking_uri.removeprefix("sqlite:///")).exists():
        return
    from mlflow.store.tracking.sqlalchemy_store import SqlAlchemyStore  # noqa: PLC0415 - as in connect()

    try:
        SqlAlchemyStore(store.tracking_uri, store.artifact_root)  # type: ignore[no-untyped-call]
    except Exception as exc:  # a database MLflow cannot open is one registry failure
        raise RegistryError(f"cannot open the MLflow database {store.display_uri}: {_first_line(exc, store)}",
                            hint=HINT) from None


def ensure_experiment(store: Store, name: str) -> str:
    """Id of experiment `name`, created with an explicit artifact location when missing."""
    from mlflow.tracking import MlflowClient  # noqa: PLC0415 - as in connect()

    client = MlflowClient(tracking_uri=store.tracking_uri, registry_uri=store.tracking_uri)
    existing = client.get_experiment_by_name(name)
    if existing is not None:
        return str(existing.experiment_id)
    return str(client.create_experiment(name, artifact_location=store.artifact_location(name)))
