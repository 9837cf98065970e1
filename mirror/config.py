"""The mirror's settings: flags, then ``SHADOW_AB_MIRROR_*`` environment, then a YAML file.

One class, :class:`MirrorSettings`, validated at start; every error names the setting and says
what to fix. Nested sections (``incumbent``, ``candidate``, ``shadow``, ``guard``, ``health``,
``kafka``) come from YAML or from the environment with ``__`` between the levels, e.g.
``SHADOW_AB_MIRROR_SHADOW__RATE=0.1`` or
``SHADOW_AB_MIRROR_CANDIDATE__REWRITE__CHAT_MAX_TOKENS=256``.
The store and Kafka also honour the project-wide ``SHADOW_AB_DATABASE_URL`` and
``SHADOW_AB_KAFKA_BOOTSTRAP`` (which sets ``kafka.bootstrap``; ``--kafka`` beats it, it beats
the YAML's).

Errors: :class:`~mirror.errors.MirrorConfigError` (a :class:`~mirror.errors.MirrorError`):
settings that cannot work (a sentence per problem).
"""

from __future__ import annotations

import base64
import os
from contextvars import ContextVar
from pathlib import Path
from typing import Any, ClassVar, Literal

import yaml
import yarl
from pydantic import (
    AliasChoices,
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)
from pydantic.fields import FieldInfo
from pydantic_core import ErrorDetails
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource, SettingsConfigDict

from mirror.errors import MirrorConfigError
from mirror.guard import GuardConfig
from mirror.headers import CANDIDATE_FORWARD_DEFAULT, CREDENTIAL_HEADERS
from mirror.health import HealthConfig
from mirror.kafka_sink import KafkaSinkConfig
from mirror.limits import ServerLimits
from mirror.overload import OverloadConfig
from mirror.privacy import PrivacyConfig
from mirror.rewrite import CandidateRewrite
from mirror.routes import DEFAULT_PASSTHROUGH, parse_route
from mirror.sampling import ShadowConfig
from shadow_ab.cli_support import explain as explain_lines
from shadow_ab.privacy import redact_url
from shadow_ab.probes import ProbeSetError, load_probe_set
from shadow_ab.settings import check_bootstrap, default_sqlite_url, normalize_database_url

Flavor = Literal["vllm", "trtllm", "auto"]


DEFAULT_PER_MINUTE = 1.0
"""One probe pair a minute per mirror process: 1,440 a day, each of the shipped 300 probes asked
about five times a day (greedy answers repeat, so more buys little: the probes, not the sends,
are the unit); the GPU arithmetic is in mirror/README.md ("Probes")."""


SINK_CLOSE_TIMEOUT_S = 30.0
"""On SIGTERM, after the drain, how long the sink keeps delivering records (a setting until
issue 26): the direct sink writes its queue in well under a second, the Kafka sink's producer
acknowledges within its message.timeout.ms (15 s) or the records stay in the spool for the
next start. drain_timeout_s + this + 15 s stays under the pods' 150 s grace."""


class ProbeConfig(BaseModel):
    """``probes:`` in the mirror's settings (the injector: :mod:`mirror.probes`)."""

    model_config = ConfigDict(extra="forbid")

    per_minute: float = Field(
        default=DEFAULT_PER_MINUTE,
        ge=0,
        le=600,
        description="probes sent to both engines per minute per mirror process (0: off); each"
        " is one pair of the shadow's budget",
    )
    set: str = Field(
        default="default",
        description="the probe set: 'default' (shipped, 300 probes) or a JSON-lines file"
        " (format: shadow_ab/probes.py)",
    )
    model: str | None = Field(
        default=None,
        description="model name of the probe requests (the candidate's is rewritten as a"
        " client's would be); none: the first model the incumbent's /v1/models lists",
    )

    @model_validator(mode="after")
    def _loadable(self) -> ProbeConfig:
        if self.per_minute > 0:
            try:
                load_probe_set(self.set)
            except ProbeSetError as exc:
                raise ValueError(f"probes.set: {exc}") from None
        return self


class HeaderFrom(BaseModel):
    """A header value kept out of the settings file: ``{env: VAR}`` (an environment variable)
    or ``{file: PATH}`` (e.g. a mounted Secret), read at start and stripped."""

    model_config = ConfigDict(extra="forbid")

    env: str | None = None
    file: Path | None = None

    @model_validator(mode="after")
    def _one(self) -> HeaderFrom:
        if (self.env is None) == (self.file is None):
            raise ValueError("give one of env: VARIABLE or file: PATH")
        return self

    def read(self, where: str) -> str:
        """The value; raise ValueError naming ``where`` when the source is missing."""
        if self.env is not None:
            value = os.environ.get(self.env)
            if not value:
                raise ValueError(f"{where}: the environment variable {self.env} is not set")
            return value.strip()
        assert self.file is not None
        try:
            return self.file.read_text().strip()
        except OSError as exc:
            raise ValueError(f"{where}: cannot read {self.file} ({exc.strerror})") from None


class EngineConfig(BaseModel):
    """One engine the mirror talks to."""

    model_config = ConfigDict(extra="forbid")

    url: str = Field(description="the engine's server root, e.g. http://10.0.0.5:8000")
    flavor: Flavor = Field(
        default="auto",
        description="how the health sampler reads /metrics: vllm, trtllm, or auto (recognised"
        " from each answer)",
    )
    engine: str | None = Field(
        default=None,
        max_length=200,
        description="engine id in records and health samples; default <flavor>@<role> when"
        " flavor is set, else vllm@incumbent and trtllm@candidate",
    )
    headers: dict[str, str | HeaderFrom] = Field(
        default_factory=dict,
        description="the engine's own headers (e.g. its Authorization), each a value, {env:"
        " VARIABLE} or {file: PATH} (a mounted Secret): the candidate gets them on every"
        " request, instead of the client's of the same name; the incumbent on the mirror's own"
        " requests only (probes, the model lookup), never on a client's",
    )

    def own_headers(self, role: str) -> list[tuple[str, str]]:
        """The mirror's own headers for this engine (lower-case names): the URL's user info
        as ``Basic`` credentials (``http://user:password@host``), then ``headers`` (a
        configured ``authorization`` wins; ``{env: ...}`` and ``{file: ...}`` read now); raise
        ValueError, naming the setting under ``role``, when a source is missing. The
        candidate gets them on every request; the incumbent only on the mirror's own
        requests (probes, the model lookup), never on a client's."""
        out: dict[str, str] = {}
        url = yarl.URL(self.url)
        if url.user is not None:
            cred = f"{url.user}:{url.password or ''}".encode()
            out["authorization"] = "Basic " + base64.b64encode(cred).decode("ascii")
        for name, value in self.headers.items():
            if isinstance(value, HeaderFrom):
                value = value.read(f"{role}.headers.{name}")
            out[name.lower()] = value
        return list(out.items())

    @property
    def bare_url(self) -> str:
        """``url`` without its user info: where the mirror's requests go (the credentials
        travel in :meth:`own_headers`, only where they belong)."""
        return str(yarl.URL(self.url).with_user(None))

    @field_validator("url")
    @classmethod
    def _http_root(cls, v: str) -> str:
        v = v.strip().rstrip("/")
        if not v.startswith(("http://", "https://")) or len(v.split("://", 1)[1]) == 0:
            raise ValueError(
                f"{redact_url(v)!r} is not an http(s) URL: give e.g. http://127.0.0.1:8000"
            )
        # The OpenAI base URL (.../v1) is accepted: the mirror adds the paths itself.
        return v.removesuffix("/v1")

    # The id's flavor when none is set: the default flavor used to be vllm for the incumbent
    # and trtllm for the candidate, and engine ids stay what they were.
    id_flavor: ClassVar[str] = "engine"

    def engine_id(self, role: str) -> str:
        if self.engine:
            return redact_url(self.engine)
        if "flavor" not in self.model_fields_set:
            return f"{self.id_flavor}@{role}"
        return f"{self.flavor if self.flavor != 'auto' else 'engine'}@{role}"


class IncumbentConfig(EngineConfig):
    id_flavor: ClassVar[str] = "vllm"
    include_usage: bool = Field(
        default=True,
        description="ask the incumbent's streams for a usage chunk too (token counts, TPOT);"
        " the mirror removes that chunk before the client sees it unless the client asked",
    )
    read_timeout_s: float | None = Field(
        default=None,
        gt=0,
        description="give up on the incumbent after this long without a byte (none: wait)",
    )


class CandidateConfig(EngineConfig):
    id_flavor: ClassVar[str] = "trtllm"
    rewrite: CandidateRewrite = Field(default_factory=CandidateRewrite)
    forward_headers: list[str] = Field(
        default_factory=lambda: list(CANDIDATE_FORWARD_DEFAULT),
        description="the client's headers the candidate gets (an allow-list; never"
        " Authorization, Cookie, api-key, x-api-key: give the candidate its own in `headers`)",
    )

    @field_validator("forward_headers")
    @classmethod
    def _no_credentials(cls, v: list[str]) -> list[str]:
        names = [n.strip().lower() for n in v if n.strip()]
        bad = sorted(set(names) & CREDENTIAL_HEADERS)
        if bad:
            raise ValueError(
                f"{', '.join(bad)} carry the client's credentials and are never sent to the"
                " candidate: give the candidate its own in candidate.headers (a value, {env:"
                " VARIABLE} or {file: PATH})"
            )
        return names


_YAML: ContextVar[dict[str, Any] | None] = ContextVar("mirror_yaml", default=None)


class _YamlSource(PydanticBaseSettingsSource):
    """The YAML file given with ``--config`` (below flags and environment)."""

    def get_field_value(self, field: FieldInfo, field_name: str) -> tuple[Any, str, bool]:
        data = _YAML.get() or {}
        return data.get(field_name), field_name, False

    def __call__(self) -> dict[str, Any]:
        return dict(_YAML.get() or {})


class MirrorSettings(BaseSettings):
    """Settings of ``shadow-ab mirror``. Environment: ``SHADOW_AB_MIRROR_<FIELD>``. Not a
    :class:`~shadow_ab.settings.CommonSettings`: its Kafka bootstrap is ``kafka.bootstrap``
    (``--kafka`` and ``SHADOW_AB_KAFKA_BOOTSTRAP`` set it: :func:`load_settings`)."""

    model_config = SettingsConfigDict(
        env_prefix="SHADOW_AB_MIRROR_",
        env_nested_delimiter="__",
        extra="forbid",
        populate_by_name=True,
    )

    host: str = Field(default="127.0.0.1", description="address to listen on")
    port: int = Field(default=8080, ge=0, le=65535, description="port to listen on")
    deployment: str = Field(
        default="default", min_length=1, max_length=200, description="deployment name in records"
    )
    database_url: str = Field(
        default_factory=default_sqlite_url,
        validation_alias=AliasChoices("SHADOW_AB_MIRROR_DATABASE_URL", "SHADOW_AB_DATABASE_URL"),
        description="direct sink store when no Kafka is configured (default: the SQLite file)",
    )
    incumbent: IncumbentConfig
    candidate: CandidateConfig
    shadow: ShadowConfig = Field(default_factory=ShadowConfig)
    guard: GuardConfig = Field(default_factory=GuardConfig)
    overload: OverloadConfig = Field(default_factory=OverloadConfig)
    health: HealthConfig = Field(default_factory=HealthConfig)
    health_enabled: bool = Field(default=True, description="run the health sampler")
    kafka: KafkaSinkConfig | None = Field(
        default=None,
        description="Kafka sink settings; records then go to Kafka instead of the store"
        " (kafka.bootstrap: --kafka > SHADOW_AB_KAFKA_BOOTSTRAP > the YAML's)",
    )
    max_body_bytes: int = Field(
        default=8 * 1024 * 1024, ge=1024, description="larger request bodies get 413"
    )
    drain_timeout_s: float = Field(
        default=30.0, ge=0, description="on SIGTERM, how long shadow requests may still finish"
    )
    log_level: Literal["debug", "info", "warning", "error"] = "info"
    privacy: PrivacyConfig = Field(
        default_factory=PrivacyConfig,
        description="what of the request and response text is recorded (mirror/README.md)",
    )
    workers: int = Field(
        default=1,
        ge=1,
        le=64,
        description="mirror processes on the port, one per core (SO_REUSEPORT); above 1,"
        " `shadow-ab mirror` supervises them (mirror/workers.py)",
    )
    admin_port: int = Field(
        default=8081, ge=0, le=65535, description="port of /metrics, /healthz and /mirror/docs"
    )
    limits: ServerLimits = Field(
        default_factory=ServerLimits,
        description="header size and time limits, idle timeout, connection cap (mirror/limits.py)",
    )
    routes: list[str] = Field(
        default_factory=lambda: list(DEFAULT_PASSTHROUGH),
        description="'METHOD /path' passed through to the incumbent besides the two generate"
        " routes ('/*' at the end: everything under it); others get 404 (mirror/routes.py)",
    )
    probes: ProbeConfig = Field(
        default_factory=ProbeConfig,
        description="synthetic probes to both engines, scored by the evaluator (mirror/probes.py)",
    )

    @field_validator("database_url")
    @classmethod
    def _known_dialect(cls, v: str) -> str:
        return normalize_database_url(v)

    @field_validator("routes")
    @classmethod
    def _routes(cls, v: list[str]) -> list[str]:
        for entry in v:
            parse_route(entry)
        return v

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        return (init_settings, env_settings, _YamlSource(settings_cls))

    @model_validator(mode="after")
    def _usable(self) -> MirrorSettings:
        if self.incumbent.url == self.candidate.url:
            raise ValueError(
                f"incumbent and candidate are the same server ({redact_url(self.incumbent.url)}):"
                " give the"
                " candidate's own URL with --candidate"
            )
        if self.admin_port == self.port and self.port != 0:
            raise ValueError(
                f"admin_port and port are both {self.port}: the admin endpoints (/metrics,"
                " /healthz) need their own port; give another with --admin-port"
            )
        if self.incumbent.engine_id("incumbent") == self.candidate.engine_id("candidate"):
            raise ValueError(
                "incumbent.engine and candidate.engine must differ (they name the engines in the"
                " records and health samples)"
            )
        if self.limits.max_body_buffer_bytes < self.max_body_bytes:
            raise ValueError(
                f"limits.max_body_buffer_bytes ({self.limits.max_body_buffer_bytes}) is below"
                f" max_body_bytes ({self.max_body_bytes}): no body of the largest size allowed"
                " could be held; raise it or lower max_body_bytes"
            )
        self.incumbent.own_headers("incumbent")  # every configured source of a header is readable
        self.candidate.own_headers("candidate")
        return self

    def incumbent_engine(self) -> str:
        return self.incumbent.engine_id("incumbent")

    def candidate_engine(self) -> str:
        return self.candidate.engine_id("candidate")


def read_yaml(path: Path) -> dict[str, Any]:
    try:
        data = yaml.safe_load(path.read_text())
    except OSError as exc:
        raise MirrorConfigError(f"cannot read the config file {path}: {exc.strerror}") from None
    except yaml.YAMLError as exc:
        raise MirrorConfigError(f"config file {path} is not YAML: {exc}") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise MirrorConfigError(f"config file {path} must hold a mapping of settings at the top")
    return data


def _deep_merge(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for k, v in over.items():
        if isinstance(v, dict) and isinstance(out.get(k), dict):
            out[k] = _deep_merge(out[k], v)
        else:
            out[k] = v
    return out


KAFKA_BOOTSTRAP_ENV = "SHADOW_AB_KAFKA_BOOTSTRAP"
"""The project-wide Kafka bootstrap variable (:class:`~shadow_ab.settings.CommonSettings`), the
mirror's ``kafka.bootstrap`` when no ``--kafka`` is given."""


def load_settings(
    config: Path | str | None = None, *, kafka_bootstrap: str | None = None, **flags: Any
) -> MirrorSettings:
    """Settings from flags (non-None values; nested ones as dicts), the environment and the
    YAML file ``config``; raise :class:`MirrorConfigError` listing what to fix.
    ``kafka_bootstrap`` (``--kafka``), else ``SHADOW_AB_KAFKA_BOOTSTRAP``, is
    ``kafka.bootstrap`` over the YAML's (the ``kafka:`` section's other settings kept)."""
    data = read_yaml(Path(config)) if config is not None else {}
    if "SHADOW_AB_MIRROR_KAFKA_BOOTSTRAP" in os.environ:  # the environment ignores an unknown
        raise MirrorConfigError(  # name: say so rather than go to the store without Kafka
            "invalid mirror settings:\n  SHADOW_AB_MIRROR_KAFKA_BOOTSTRAP: removed setting:"
            f" {REMOVED['kafka_bootstrap']}; unset it"
        )
    bootstrap = kafka_bootstrap
    if not bootstrap and "bootstrap" not in (flags.get("kafka") or {}):
        bootstrap = os.environ.get(KAFKA_BOOTSTRAP_ENV) or None
    if bootstrap is not None:
        try:
            check_bootstrap(bootstrap)
        except ValueError as exc:
            where = "--kafka" if kafka_bootstrap else KAFKA_BOOTSTRAP_ENV
            raise MirrorConfigError(f"invalid mirror settings:\n  {where}: {exc}") from None
        flags["kafka"] = _deep_merge(flags.get("kafka") or {}, {"bootstrap": bootstrap})
    given: dict[str, Any] = {}
    for key, value in flags.items():
        if value is None:
            continue
        given = (
            _deep_merge(given, {key: value}) if isinstance(value, dict) else given | {key: value}
        )
    token = _YAML.set(data)
    try:
        return MirrorSettings(**given)
    except ValidationError as exc:
        raise MirrorConfigError(explain(exc)) from None
    finally:
        _YAML.reset(token)


_SINCE = "since issue 26"
_GUARD = f"a constant of mirror/guard.py (GuardTuning) {_SINCE}"
_OVERLOAD = f"a constant of mirror/overload.py {_SINCE}"
_KAFKA = f"a constant of mirror/kafka_sink.py {_SINCE}"
_CONNECT = f"a constant of mirror/upstream.py (CONNECT_TIMEOUT_S, 5 s) {_SINCE}"
_HEADERS = (
    "give the header in headers as {env: VARIABLE} or {file: PATH}, e.g. headers:"
    f" {{authorization: {{file: /run/secrets/key}}}} {_SINCE}"
)
_KEEPALIVE = f"a constant of mirror/upstream.py (KEEPALIVE_S, 4 s) {_SINCE}"
_UNCAPPED = (
    "the engines' pools have no cap (shadow.max_concurrent bounds the shadow side, the client"
    f" connections the incumbent's) {_SINCE}"
)
REMOVED: dict[str, str] = {
    "guard.window_s": _GUARD,
    "guard.max_samples": _GUARD,
    "guard.min_samples": _GUARD,
    "guard.evaluate_interval_s": _GUARD,
    "guard.decrease_factor": _GUARD,
    "guard.backoff_cooldown_s": _GUARD,
    "guard.increase_step": _GUARD,
    "guard.recovery_interval_s": _GUARD,
    "guard.max_rate": _GUARD,
    "guard.baseline_window_s": _GUARD,
    "guard.baseline_ttft_s": _GUARD,
    "guard.baseline_e2e_s": _GUARD,
    "overload.interval_ms": _OVERLOAD,
    "overload.window_s": _OVERLOAD,
    "overload.scaled_lag_ms": _OVERLOAD,
    "overload.saturated_lag_ms": _OVERLOAD,
    "kafka.spool_segment_bytes": _KAFKA,
    "kafka.spool_fsync": _KAFKA,
    "kafka.queue_max": _KAFKA,
    "kafka.max_in_flight": _KAFKA,
    "kafka.retry_backoff_s": _KAFKA,
    "kafka.retry_backoff_max_s": _KAFKA,
    "incumbent.connect_timeout_s": _CONNECT,
    "candidate.connect_timeout_s": _CONNECT,
    "incumbent.keepalive_timeout_s": _KEEPALIVE,
    "candidate.keepalive_timeout_s": _KEEPALIVE,
    "incumbent.max_connections": _UNCAPPED,
    "candidate.max_connections": _UNCAPPED,
    "shadow.replay_pool": f"replays always use their own pool to the incumbent {_SINCE}",
    "shadow.replay_cache_salt": f"every replay carries a random cache_salt {_SINCE}",
    "shadow.load_parity_slack": f"a constant of mirror/sampling.py (0) {_SINCE}",
    "health.timeout_s": f"a constant of mirror/health.py (TIMEOUT_S, 2 s) {_SINCE}",
    "probes.seed": f"the probes' order is random per start {_SINCE}",
    "sink_close_timeout_s": f"a constant of mirror/config.py (SINK_CLOSE_TIMEOUT_S, 30 s) {_SINCE}",
    "direct_queue_max_bytes": f"the direct sink holds 256 MiB of records at most {_SINCE}",
    "privacy.opt_out_header": f"the header is x-shadow-capture (mirror/privacy.py) {_SINCE}",
    "privacy.hash_key": f"give the digest key in a file, privacy.hash_key_file {_SINCE}",
    "hide_response_headers": (
        "server and set-cookie are always hidden (HIDDEN_RESPONSE_HEADERS in mirror/headers.py)"
        f" {_SINCE}"
    ),
    "admin_host": f"the admin port listens on host, as the client port {_SINCE}",
    "incumbent.headers_env": _HEADERS,
    "incumbent.headers_files": _HEADERS,
    "candidate.headers_env": _HEADERS,
    "candidate.headers_files": _HEADERS,
    "kafka_bootstrap": (
        "give kafka.bootstrap (or --kafka, SHADOW_AB_KAFKA_BOOTSTRAP); the kafka: section"
        f" holds the sink's settings {_SINCE}"
    ),
    "reuse_port": (
        f"workers: N runs N mirror processes on the port, each with SO_REUSEPORT {_SINCE}"
    ),
    "candidate.rewrite.model": (
        f'candidate.rewrite.model_map with the key "*" maps every model {_SINCE}'
    ),
    "candidate.rewrite.completions_max_tokens": (
        "a completions request without max_tokens gets vLLM's default, 16"
        f" (COMPLETIONS_MAX_TOKENS in mirror/rewrite.py) {_SINCE}"
    ),
    "candidate.rewrite.include_usage": (
        "a streamed candidate request always asks for its usage (its token count is what TPOT"
        f" needs, and asking costs the engine nothing) {_SINCE}"
    ),
}
"""Settings that existed and no longer do: a YAML file, a flag or a variable that still sets
one is refused with what replaced it (issue 26, "Fewer choices")."""


_FLAG_HINT = {
    "incumbent": "--incumbent URL (or incumbent.url in YAML, SHADOW_AB_MIRROR_INCUMBENT__URL)",
    "candidate": "--candidate URL (or candidate.url in YAML, SHADOW_AB_MIRROR_CANDIDATE__URL)",
}


def explain(exc: ValidationError) -> str:
    """One line per problem: the setting's dotted name and what is wrong with it."""
    return "invalid mirror settings:\n  " + "\n  ".join(explain_lines(exc, message=_hint))


def _hint(loc: str, err: ErrorDetails) -> str | None:
    if err["type"] == "missing" and loc in _FLAG_HINT:
        return f"required: give {_FLAG_HINT[loc]}"
    if err["type"] == "extra_forbidden":
        if loc in REMOVED:
            return f"removed setting: {REMOVED[loc]}; delete it from the settings"
        return "unknown setting (see mirror/README.md for the settings)"
    return None
