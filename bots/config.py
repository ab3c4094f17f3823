"""The bot's TOML configuration, validated by pydantic.

Every problem is reported as `file:line: key.path: message`, with the line of the offending key (or of its
table when the key is missing), so an operator can fix a broken file at 3 a.m. without guessing. Unknown keys
are errors (a typo must not silently fall back to a default). Secrets never live in the file: a key that
looks like one (`token`, `secret`, `api_key`, ...) or a value that looks like a Slack/OpenAI/Anthropic
credential is refused with the name of the environment variable to use instead.

Relative paths are resolved against the working directory of the process (the repository root for
`make run` and the Procfile).
"""

from __future__ import annotations

import itertools
import re
import tomllib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Literal
from urllib.parse import urlsplit

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    PrivateAttr,
    ValidationError,
    field_validator,
    model_validator,
)

from harness_core import CompactionSettings, HarnessSettings, ModelRef, RetrySettings, ToolSettings

PROVIDERS = ("openai", "anthropic", "faux")
FAUX_MODELS = ("demo",)
HOST_ADAPTER_KEYS = ("module", "enabled")  # read by the host, not passed to an adapter's create()
OPS_TOOLS = ("search_logs", "open_ticket", "deploy", "schedule", "search_history")
DEFAULT_INSTRUCTIONS = (
    "You are an operations assistant in a team chat. Messages arrive as '<display name>: <text>'. "
    "Investigate with search_logs before proposing changes, open tickets with open_ticket, and use deploy "
    "only with a concrete service and version: every deploy waits for a human approver, so say what you are "
    "about to deploy and why. Use search_history to find what was said earlier, and schedule for reminders. "
    "If a tool reports it was interrupted, do not blindly repeat it: say so and suggest how to check. "
    "Be brief and concrete."
)


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class BotSection(_Section):
    name: str = "ops-bot"
    model: str = "faux:demo"
    instructions: str = DEFAULT_INSTRUCTIONS

    @field_validator("model")
    @classmethod
    def _check_model(cls, value: str) -> str:
        try:
            ref = ModelRef.parse(value)
        except ValueError:
            raise ValueError(
                f"model must look like 'provider:model' (e.g. 'openai:gpt-4o', "
                f"'anthropic:claude-sonnet-4-5', 'faux:demo'), got {value!r}"
            ) from None
        if ref.provider not in PROVIDERS:
            raise ValueError(f"unknown model provider {ref.provider!r}; use one of {', '.join(PROVIDERS)}")
        if ref.provider == "faux" and ref.model_id not in FAUX_MODELS:
            raise ValueError(f"the faux provider only has the offline demo script 'faux:demo', got {value!r}")
        return value

    @property
    def model_ref(self) -> ModelRef:
        return ModelRef.parse(self.model)


STORAGE_SCHEMES = ("postgresql", "postgres", "sqlite")


class StorageSection(_Section):
    """Where the store lives: a SQLite file (`path`, the default) or a database URL (`url`). With neither
    named, `DATABASE_URL` from the environment is used when set (the 12-factor convention)."""

    path: Path = Path("var/ops.sqlite")
    durability: Literal["normal", "full"] = "normal"
    url: str | None = None  # "postgresql://user@host/db" or "sqlite:///var/ops.sqlite"
    lease_ttl: float = Field(default=10.0, gt=0, le=600)  # PostgreSQL: how long a dead owner holds the store
    # PostgreSQL: how many partitions the store is split into, fixed when the store is created (workers share
    # them out; 1 = one leader and standbys). SQLite ignores it: one process owns the file.
    partitions: int = Field(default=64, ge=1, le=1024)

    @field_validator("url")
    @classmethod
    def _check_url(cls, value: str | None) -> str | None:
        if value is None:
            return None
        problem = storage_url_problem(value)
        if problem is not None:
            raise ValueError(problem)
        if urlsplit(value).password:
            raise ValueError(
                "the URL holds a password, and secrets never live in the config file: leave [storage] url "
                "out and set DATABASE_URL, or keep the password in PGPASSWORD or ~/.pgpass"
            )
        return value

    @model_validator(mode="after")
    def _one_place(self) -> StorageSection:
        if self.url is not None and "path" in self.model_fields_set:
            raise ValueError("name the storage once: either path (a SQLite file) or url, not both")
        return self


def storage_url_problem(url: str) -> str | None:
    """Why `url` cannot name a storage (None when it can). Never echoes the URL: it may hold a password."""
    try:
        parts = urlsplit(url)
    except ValueError:
        return "not a valid URL"
    if parts.scheme not in STORAGE_SCHEMES:
        return "must start with postgresql:// (or postgres://) or sqlite:///, e.g. sqlite:///var/ops.sqlite"
    if parts.scheme == "sqlite" and (parts.netloc or not parts.path.strip("/")):
        return "a SQLite URL names a file: sqlite:///relative/path.sqlite or sqlite:////absolute/path.sqlite"
    return None


@dataclass(frozen=True)
class StorageTarget:
    """The storage the bot opens: a SQLite file, or a PostgreSQL URL (which may hold a password: never print
    it; `PostgresStorage.description` is the printable form)."""

    kind: Literal["sqlite", "postgres"]
    path: Path | None = None
    url: str | None = None
    source: str = "config"  # "config" or "DATABASE_URL"


def storage_target_of(url: str, source: str) -> StorageTarget:
    parts = urlsplit(url)
    if parts.scheme == "sqlite":
        # sqlite:///var/x.sqlite is relative to the working directory, sqlite:////var/x.sqlite absolute.
        return StorageTarget("sqlite", path=Path(parts.path[1:]).absolute(), source=source)
    return StorageTarget("postgres", url=url, source=source)


AnswerMode = Literal["mentions", "all", "none"]


class WorkersSection(_Section):
    """Workers sharing a PostgreSQL store split into partitions (`[storage] partitions` > 1)."""

    # "separate": each worker takes its Slack events in (Socket Mode connection or HTTP endpoint, ingress
    # commit, acknowledgement) in a child process of its own, so an acknowledgement never waits behind this
    # worker's turns; the worker itself answers and delivers. "shared": one process does both.
    intake: Literal["shared", "separate"] = "shared"
    # With "separate": the niceness (0-19) the worker lowers itself to once its intake process runs, so on a
    # saturated CPU acknowledgements get it first and turns end a little later (`bots.cpu_priority`); 0 keeps
    # the normal priority.
    worker_nice: int = Field(default=10, ge=0, le=19)


class AnswerSection(_Section):
    mode: AnswerMode = "mentions"
    record_unaddressed: bool = True
    reply_in_thread: bool = False
    dms: bool = True


class ChannelSection(_Section):
    """Per-channel overrides; keys left out inherit `[answer]`."""

    mode: AnswerMode | None = None
    record_unaddressed: bool | None = None
    reply_in_thread: bool | None = None


Seconds = Annotated[float, Field(gt=0, allow_inf_nan=False)]


class ToolsSection(_Section):
    """`timeout`: seconds one tool call may run before it is stopped and the model gets an error result, for
    every tool that declares no limit of its own; `[tools.timeouts]` sets it per tool name (and wins over the
    tool's own)."""

    enabled: list[str] | None = None  # None: the ops tools plus every tool of `modules`
    modules: list[str] = Field(default_factory=list)  # import paths of modules exporting `extension`
    timeout: Seconds = 60.0
    timeouts: dict[str, Seconds] = Field(default_factory=dict)


class ApprovalsSection(_Section):
    tools: list[str] = Field(default_factory=lambda: ["deploy"])
    approvers: list[str] = Field(default_factory=list)  # "slack:U…", "discord:<id>", "devchat:<name>"
    groups: list[str] = Field(default_factory=list)  # "slack:S…" user groups, "discord:<role id>"
    expires_minutes: float = Field(default=60.0, gt=0)
    allow_self_approval: bool = False


class DeploySection(_Section):
    webhook_url: str | None = None  # DEPLOY_WEBHOOK_URL overrides it
    timeout_seconds: float = Field(default=10.0, gt=0)
    record_path: Path | None = None  # without a webhook: deploys are recorded here (default <storage dir>)

    @field_validator("webhook_url")
    @classmethod
    def _check_url(cls, value: str | None) -> str | None:
        if value is None:
            return None
        if not re.match(r"^https?://[^/\s]+", value):
            raise ValueError(f"webhook_url must be an http(s) URL, got {value!r}")
        if re.match(r"^https?://[^/@\s]*:[^/@\s]*@", value):
            raise ValueError(
                "webhook_url must not carry credentials; set DEPLOY_WEBHOOK_TOKEN (sent as a bearer token) or "
                "DEPLOY_WEBHOOK_URL in the environment instead"
            )
        return value


class LogsSection(_Section):
    path: Path = Path("config/sample-logs")  # a log file or a directory searched recursively
    max_results: int = Field(default=50, gt=0, le=1000)


class TicketsSection(_Section):
    path: Path | None = None  # the JSON tracker (default <storage dir>/tickets.json)


class RetrySection(_Section):
    enabled: bool = True
    max_retries: int = Field(default=3, ge=0)
    base_delay_ms: int = Field(default=2_000, ge=0)
    max_delay_ms: int = Field(default=60_000, ge=0)


class CompactionSection(_Section):
    enabled: bool = True
    reserve_tokens: int = Field(default=16_384, ge=0)
    keep_recent_tokens: int = Field(default=20_000, ge=0)
    background_tokens: int = Field(default=32_768, ge=0)


class TasksSection(_Section):
    restart_limit: int = Field(default=5, ge=0)
    tool_execution: Literal["parallel", "sequential"] = "parallel"


class AdminSection(_Section):
    """The admin HTTP endpoint (/healthz, /readyz, /metrics; see bots/admin.py). Off unless `listen` is set."""

    listen: str | None = None  # "host:port", e.g. "127.0.0.1:9100"; a non-loopback host needs ADMIN_TOKEN

    @field_validator("listen")
    @classmethod
    def _check_listen(cls, value: str | None) -> str | None:
        if value is None:
            return None
        host, _, port = value.rpartition(":")
        if not host or not port.isdigit() or not 0 <= int(port) <= 65535:
            raise ValueError(f"listen must look like 'host:port' (e.g. '127.0.0.1:9100'), got {value!r}")
        return value

    @property
    def address(self) -> tuple[str, int] | None:
        if self.listen is None:
            return None
        host, _, port = self.listen.rpartition(":")
        return host.strip("[]"), int(port)


class LoggingSection(_Section):
    format: Literal["text", "json"] = "text"  # json: one object per line (`--log-format` overrides)


class BotConfig(_Section):
    bot: BotSection = Field(default_factory=BotSection)
    storage: StorageSection = Field(default_factory=StorageSection)
    workers: WorkersSection = Field(default_factory=WorkersSection)
    answer: AnswerSection = Field(default_factory=AnswerSection)
    channels: dict[str, ChannelSection] = Field(default_factory=dict)
    tools: ToolsSection = Field(default_factory=ToolsSection)
    approvals: ApprovalsSection = Field(default_factory=ApprovalsSection)
    deploy: DeploySection = Field(default_factory=DeploySection)
    logs: LogsSection = Field(default_factory=LogsSection)
    tickets: TicketsSection = Field(default_factory=TicketsSection)
    retry: RetrySection = Field(default_factory=RetrySection)
    compaction: CompactionSection = Field(default_factory=CompactionSection)
    tasks: TasksSection = Field(default_factory=TasksSection)
    admin: AdminSection = Field(default_factory=AdminSection)
    logging: LoggingSection = Field(default_factory=LoggingSection)
    adapters: dict[str, dict[str, Any]] = Field(default_factory=dict)  # passed to each adapter's create()

    _source: Path = PrivateAttr(default=Path("<memory>"))
    _lines: dict[tuple[str | int, ...], int] = PrivateAttr(default_factory=dict)

    # --- derived values -----------------------------------------------------------------------------------

    @property
    def source(self) -> Path:
        return self._source

    @property
    def storage_path(self) -> Path:
        """The SQLite file (from `path`, or a sqlite:/// `url`); with PostgreSQL its directory still holds
        the bot's own files (tickets, recorded deploys)."""
        if self.storage.url is not None and self.storage.url.startswith("sqlite:"):
            path = storage_target_of(self.storage.url, "config").path
            assert path is not None
            return path
        return self.storage.path.absolute()

    def storage_target(self, env: Mapping[str, str]) -> StorageTarget:
        """`[storage] url`, else `[storage] path`, else `DATABASE_URL` when set, else the default file."""
        if self.storage.url is not None:
            return storage_target_of(self.storage.url, "config")
        if "path" not in self.storage.model_fields_set and env.get("DATABASE_URL"):
            url = env["DATABASE_URL"]
            problem = storage_url_problem(url)
            if problem is not None:
                raise ConfigError([Problem("environment", None, "DATABASE_URL", problem)])
            return storage_target_of(url, "DATABASE_URL")
        return StorageTarget("sqlite", path=self.storage_path)

    @property
    def data_dir(self) -> Path:
        """Where the bot's own files live next to the storage (tickets, recorded deploys)."""
        return self.storage_path.parent

    @property
    def tickets_path(self) -> Path:
        return (self.tickets.path or self.data_dir / "tickets.json").absolute()

    @property
    def deploy_record_path(self) -> Path:
        return (self.deploy.record_path or self.data_dir / "deploys.jsonl").absolute()

    @property
    def logs_path(self) -> Path:
        return self.logs.path.absolute()

    def harness_settings(self) -> HarnessSettings:
        return HarnessSettings(
            retry=RetrySettings(**self.retry.model_dump()),
            compaction=CompactionSettings(**self.compaction.model_dump()),
            restart_limit=self.tasks.restart_limit,
            tool_execution=self.tasks.tool_execution,
            tools=ToolSettings(timeout=self.tools.timeout, timeouts=dict(self.tools.timeouts)),
        )

    def adapter_options(self, name: str) -> dict[str, Any]:
        """The `[adapters.<name>]` table as given, minus the keys the host reads (`module`, `enabled`), for
        the adapter's `create()`."""
        options = dict(self.adapters.get(name, {}))
        for key in HOST_ADAPTER_KEYS:
            options.pop(key, None)
        return options

    def adapter_enabled(self, name: str) -> bool:
        return bool(self.adapters.get(name, {}).get("enabled", True))

    def adapter_module(self, name: str) -> str:
        module = self.adapters.get(name, {}).get("module")
        return str(module) if module else f"adapters.{name}"

    def problem(self, loc: tuple[str | int, ...], message: str) -> Problem:
        """A problem found after validation (e.g. an unknown tool name), located in the file."""
        return Problem(str(self._source), _line_for(self._lines, loc), _dotted(loc), message)


# --- errors ------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Problem:
    file: str
    line: int | None
    key: str
    message: str

    def __str__(self) -> str:
        where = f"{self.file}:{self.line}" if self.line is not None else self.file
        return f"{where}: {self.key}: {self.message}" if self.key else f"{where}: {self.message}"


class ConfigError(Exception):
    def __init__(self, problems: list[Problem]) -> None:
        self.problems = sorted(problems, key=lambda p: (p.line or 0, p.key))
        super().__init__("\n".join(str(p) for p in self.problems))


# --- loading -----------------------------------------------------------------------------------------------


def load_config(path: str | Path) -> BotConfig:
    """Read and validate a config file; raises `ConfigError` naming file, line and key of every problem."""
    file = Path(path)
    try:
        text = file.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(
            [Problem(str(file), None, "", f"cannot read the config file: {exc.strerror}")]
        ) from None
    return parse_config(text, file)


def parse_config(text: str, source: str | Path = "<config>") -> BotConfig:
    file = str(source)
    try:
        raw = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        match = re.search(r"\(at line (\d+), column \d+\)", str(exc))
        line = int(match.group(1)) if match else None
        message = re.sub(r"\s*\(at line \d+, column \d+\)", "", str(exc)) or "invalid TOML"
        raise ConfigError([Problem(file, line, "", f"TOML syntax error: {message}")]) from None
    lines = key_lines(text)
    secrets = _secret_problems(raw, lines, file)
    if secrets:
        raise ConfigError(secrets)
    try:
        config = BotConfig.model_validate(raw)
    except ValidationError as exc:
        raise ConfigError([_problem(file, lines, err) for err in exc.errors()]) from None
    config._source = Path(source)
    config._lines = lines
    problems = _cross_checks(config)
    if problems:
        raise ConfigError(problems)
    return config


def _problem(file: str, lines: dict[tuple[str | int, ...], int], err: Any) -> Problem:
    loc = tuple(err["loc"])
    kind = err["type"]
    if kind == "extra_forbidden":
        allowed = _allowed_keys(loc[:-1])
        message = "unknown key" + (f" (allowed here: {', '.join(allowed)})" if allowed else "")
    elif kind == "missing":
        message = "required key is missing"
    else:
        message = str(err["msg"]).removeprefix("Value error, ")
        value = err.get("input")
        if (
            isinstance(value, (str, int, float, bool))
            and kind != "value_error"
            and repr(value) not in message
        ):
            message += f" (got {value!r})"
    return Problem(file, _line_for(lines, loc), _dotted(loc), message)


def _allowed_keys(loc: tuple[str | int, ...]) -> list[str]:
    model: Any = BotConfig
    parts = list(loc)
    while parts:
        part = parts.pop(0)
        if not (isinstance(model, type) and issubclass(model, BaseModel)):
            return []
        field = model.model_fields.get(str(part))
        if field is None:
            return []
        annotation = field.annotation
        args: tuple[Any, ...] = getattr(annotation, "__args__", ())
        if getattr(annotation, "__origin__", None) is dict and len(args) == 2:
            if not parts:
                return []
            parts.pop(0)  # the dict key (a channel id): the value type holds the keys
            model = args[-1]
            continue
        model = annotation
    if isinstance(model, type) and issubclass(model, BaseModel):
        return list(model.model_fields)
    return []


def _dotted(loc: tuple[str | int, ...]) -> str:
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            text = part if re.fullmatch(r"[A-Za-z0-9_-]+", part) else f'"{part}"'
            out += ("." if out else "") + text
    return out


def _cross_checks(config: BotConfig) -> list[Problem]:
    problems: list[Problem] = []
    for name, table in config.adapters.items():
        if "module" in table and not (isinstance(table["module"], str) and table["module"].strip()):
            problems.append(config.problem(("adapters", name, "module"), "must be a module name (a string)"))
        if "enabled" in table and not isinstance(table["enabled"], bool):
            problems.append(config.problem(("adapters", name, "enabled"), "must be true or false"))
    approvals = config.approvals
    enabled = config.tools.enabled
    gated = [t for t in approvals.tools if enabled is None or t in enabled]
    if gated and not approvals.approvers and not approvals.groups:
        problems.append(
            config.problem(
                ("approvals", "approvers"),
                f"nobody may approve {', '.join(gated)}: list approver ids in approvals.approvers "
                "or groups/roles in approvals.groups (or set approvals.tools = [])",
            )
        )
    running = [name for name in config.adapters if config.adapter_enabled(name)]
    problems.extend(approver_problems(config, running))
    if config.answer.mode == "none" and not config.answer.dms and not config.channels:
        problems.append(config.problem(("answer", "mode"), "the bot would never answer anything"))
    return problems


KNOWN_PLATFORMS = ("slack", "discord", "devchat")


def approver_problems(config: BotConfig, running: Sequence[str]) -> list[Problem]:
    """Approver and group entries are `platform:id` (`slack:U0LEAD`, `discord:1234`, `devchat:lead`). A bare id
    is accepted while one adapter runs; with several it is ambiguous (a devchat user can type any name, so a
    bare Slack id would let them approve), and so is an unknown platform prefix."""
    problems: list[Problem] = []
    platforms = sorted({*KNOWN_PLATFORMS, *config.adapters})
    for field_name in ("approvers", "groups"):
        for index, entry in enumerate(getattr(config.approvals, field_name)):
            platform, colon, rest = entry.partition(":")
            loc: tuple[str | int, ...] = ("approvals", field_name, index)
            if colon and rest and platform.isidentifier() and platform.islower():
                if platform not in platforms:
                    problems.append(
                        config.problem(
                            loc,
                            f"unknown platform {platform!r} in {entry!r}; use one of {', '.join(platforms)}",
                        )
                    )
            elif len(running) > 1:
                problems.append(
                    config.problem(
                        loc,
                        f"{entry!r} is ambiguous with several adapters ({', '.join(running)}): write it as "
                        f"'<platform>:{entry}', e.g. '{running[0]}:{entry}'",
                    )
                )
    return problems


# --- secrets -----------------------------------------------------------------------------------------------

_SECRET_WORDS = {"token", "secret", "password", "passwd", "apikey", "credential", "credentials"}
_SECRET_PAIRS = {("api", "key"), ("private", "key"), ("access", "key"), ("signing", "key")}
# Searched anywhere inside a string value (a token pasted into `instructions` is as leaked as one in its own key).
_SECRET_VALUES = (
    (re.compile(r"\bxox[a-z]\.xox[a-z]-[A-Za-z0-9-]+"), "a Slack refresh/user token", "SLACK_BOT_TOKEN"),
    (re.compile(r"\bxox[abposer]-[A-Za-z0-9-]{6,}"), "a Slack token", "SLACK_BOT_TOKEN"),
    (re.compile(r"\bxapp-[A-Za-z0-9-]{6,}"), "a Slack app-level token", "SLACK_APP_TOKEN"),
    (
        re.compile(r"hooks\.slack\.com/(?:services|workflows|triggers)/\S+"),
        "a Slack incoming-webhook URL",
        "",
    ),
    (
        re.compile(r"\b[MNO][A-Za-z0-9_-]{22,27}\.[A-Za-z0-9_-]{6,7}\.[A-Za-z0-9_-]{27,45}\b"),
        "a Discord bot token",
        "DISCORD_BOT_TOKEN",
    ),
    (re.compile(r"\bsk-ant-[A-Za-z0-9_-]{8,}"), "an Anthropic API key", "ANTHROPIC_API_KEY"),
    (re.compile(r"\bsk-[A-Za-z0-9_-]{16,}"), "an OpenAI API key", "OPENAI_API_KEY"),
    (
        re.compile(
            r"(?i)[?&](?:[a-z_]*token|[a-z_]*secret|key|api_?key|sig|signature|password|auth)=[^&\s#]+"
        ),
        "a URL carrying a credential in its query",
        "",
    ),
    (re.compile(r"(?i)\bhttps?://[^/@\s:]+:[^/@\s]+@"), "a URL with a user:password", ""),
)


def _secret_key(name: str) -> bool:
    words = [w for w in re.split(r"[^a-z0-9]+", name.lower()) if w]
    if any(w in _SECRET_WORDS for w in words):
        return True
    return any(pair in _SECRET_PAIRS for pair in itertools.pairwise(words))


def _env_for(path: tuple[str, ...], raw: Mapping[str, Any]) -> str:
    name = path[-1].lower()
    if len(path) >= 2 and path[0] == "adapters":
        if path[1] == "slack":
            if "signing" in name:
                return "SLACK_SIGNING_SECRET"
            if "app" in name:
                return "SLACK_APP_TOKEN"
            return "SLACK_BOT_TOKEN"
        if path[1] == "discord":
            return "DISCORD_BOT_TOKEN"
    if path[0] == "deploy":
        return "DEPLOY_WEBHOOK_TOKEN"
    model = str((raw.get("bot") or {}).get("model", "")) if isinstance(raw.get("bot"), Mapping) else ""
    if model.startswith("anthropic:"):
        return "ANTHROPIC_API_KEY"
    if model.startswith("openai:"):
        return "OPENAI_API_KEY"
    return "OPENAI_API_KEY or ANTHROPIC_API_KEY"


def _secret_problems(
    raw: Mapping[str, Any], lines: dict[tuple[str | int, ...], int], file: str
) -> list[Problem]:
    problems: list[Problem] = []

    def walk(node: Any, path: tuple[str, ...]) -> None:
        if isinstance(node, Mapping):
            for key, value in node.items():
                here = (*path, str(key))
                if _secret_key(str(key)) and not isinstance(value, Mapping):
                    env = _env_for(here, raw)
                    problems.append(
                        Problem(
                            file,
                            _line_for(lines, here),
                            _dotted(here),
                            f"secrets do not belong in the config file: remove this key and set {env} in "
                            "the environment instead",
                        )
                    )
                    continue
                walk(value, here)
        elif isinstance(node, list):
            for item in node:
                walk(item, path)
        elif isinstance(node, str):
            for pattern, what, env in _SECRET_VALUES:
                if pattern.search(node):
                    if not env and path[:1] == ("deploy",):
                        env = "DEPLOY_WEBHOOK_URL (or DEPLOY_WEBHOOK_TOKEN, sent as a bearer token)"
                    where = f"set {env} in the environment" if env else "keep it in an environment variable"
                    problems.append(
                        Problem(
                            file,
                            _line_for(lines, path),
                            _dotted(path),
                            f"this value looks like {what}; secrets do not belong in the config file: {where} "
                            "instead",
                        )
                    )
                    break

    walk(raw, ())
    return problems


# --- where is a key? ----------------------------------------------------------------------------------------

_BARE = re.compile(r"[A-Za-z0-9_-]+")


def _line_for(lines: dict[tuple[str | int, ...], int], loc: tuple[str | int, ...]) -> int | None:
    """The line of `loc`, else of its nearest ancestor that appears in the file (a missing key: its table)."""
    for end in range(len(loc), 0, -1):
        found = lines.get(tuple(loc[:end]))
        if found is not None:
            return found
    return None


def key_lines(text: str) -> dict[tuple[str | int, ...], int]:
    """Map every table header and key of a TOML document to the (1-based) line that defines it.

    A small scanner, not a parser (tomllib already validated the syntax): it tracks the current table,
    dotted and quoted keys, arrays of tables, and skips the continuation lines of multi-line strings and
    arrays so their content is never mistaken for keys. Keys inside inline tables map to their table's line
    through `_line_for`'s ancestor fallback.
    """
    lines: dict[tuple[str | int, ...], int] = {}
    table: tuple[str | int, ...] = ()
    array_counts: dict[tuple[str | int, ...], int] = {}
    state = _ScanState()
    for number, line in enumerate(text.splitlines(), start=1):
        if state.multiline is not None or state.depth > 0:
            _scan_value(line, state)
            continue
        stripped = line.strip()
        if not stripped or stripped.startswith("#"):
            continue
        if stripped.startswith("[["):
            keys, _ = _parse_key(stripped, 2)
            path: tuple[str | int, ...] = tuple(keys)
            index = array_counts.get(path, 0)
            array_counts[path] = index + 1
            lines.setdefault(path, number)
            table = (*path, index)
            lines.setdefault(table, number)
            continue
        if stripped.startswith("["):
            keys, _ = _parse_key(stripped, 1)
            table = tuple(keys)
            for end in range(1, len(table) + 1):
                lines.setdefault(table[:end], number)
            continue
        keys, rest = _parse_key(stripped, 0)
        if not keys:
            continue
        full = (*table, *keys)
        for end in range(len(table) + 1, len(full) + 1):
            lines.setdefault(full[:end], number)
        value = rest.lstrip()
        if value.startswith("="):
            _scan_value(value[1:], state)
    return lines


@dataclass
class _ScanState:
    multiline: str | None = None  # the closing delimiter of an open multi-line string
    depth: int = 0  # open [ and { of a value that spans lines


def _scan_value(text: str, state: _ScanState) -> None:
    i = 0
    n = len(text)
    while i < n:
        if state.multiline is not None:
            end = text.find(state.multiline, i)
            if end < 0:
                return
            i = end + 3
            state.multiline = None
            continue
        char = text[i]
        if char == "#":
            return
        if text.startswith('"""', i) or text.startswith("'''", i):
            state.multiline = text[i : i + 3]
            i += 3
            continue
        if char == '"':
            i += 1
            while i < n and text[i] != '"':
                i += 2 if text[i] == "\\" else 1
            i += 1
            continue
        if char == "'":
            end = text.find("'", i + 1)
            i = n if end < 0 else end + 1
            continue
        if char in "[{":
            state.depth += 1
        elif char in "]}":
            state.depth = max(0, state.depth - 1)
        i += 1


def _parse_key(text: str, start: int) -> tuple[list[str], str]:
    """Parse a (dotted, possibly quoted) key at `start`; returns the parts and the text after it."""
    keys: list[str] = []
    i = start
    n = len(text)
    while i < n:
        while i < n and text[i] in " \t":
            i += 1
        if i >= n:
            break
        char = text[i]
        if char == '"':
            j = i + 1
            out = []
            while j < n and text[j] != '"':
                if text[j] == "\\" and j + 1 < n:
                    out.append(text[j + 1])
                    j += 2
                    continue
                out.append(text[j])
                j += 1
            keys.append("".join(out))
            i = j + 1
        elif char == "'":
            j = text.find("'", i + 1)
            j = n if j < 0 else j
            keys.append(text[i + 1 : j])
            i = j + 1
        else:
            match = _BARE.match(text, i)
            if match is None:
                break
            keys.append(match.group(0))
            i = match.end()
        while i < n and text[i] in " \t":
            i += 1
        if i < n and text[i] == ".":
            i += 1
            continue
        break
    return keys, text[i:]
