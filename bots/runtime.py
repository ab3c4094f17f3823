"""Wiring: config → models, storage, harness, bridge, tools and adapters; the `run` loop and its shutdown.

`open_runtime()` is shared by `run` and every operator command, so they all see the same registry (a task
whose definition is missing would show as `blocked`). It takes the storage's owner lock: while the bot runs,
operator commands get `StorageLocked` and say so instead of touching the file.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import importlib
import json
import logging
import os
import re
import signal
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

import httpx

from adapters.base import Adapter
from adapters.bridge import ApprovalPolicy, Bridge, BridgeConfig, ChannelPolicy, PlaceDoc
from adapters.health import health_of
from adapters.redact import install_log_redaction, redact_text, redact_url
from bots.admin import AdminError, AdminServer, readiness_of
from bots.config import OPS_TOOLS, BotConfig, Problem, approver_problems
from bots.demo import demo_delay, demo_provider
from bots.metrics import BotMetrics
from bots.operator_requests import OperatorDesk
from bots.ops import OpsContext, history_extension, ops_extension
from bots.reload import Reloads
from bots.store_pruner import StorePruner
from harness_core import (
    AgentChange,
    AgentDoc,
    Extension,
    Harness,
    ModelRef,
    Models,
    Registry,
    StorageCorrupt,
    StorageError,
    StorageLocked,
    Tx,
)
from harness_core.models.anthropic import AnthropicProvider
from harness_core.models.openai import OpenAIProvider
from harness_core.storage import LeaseHolder, OperatorRequests, PostgresStorage, SqliteStorage, Storage

log = logging.getLogger("bots")

AdapterFactory = Callable[[dict[str, Any], Mapping[str, str]], Adapter]
EXIT_OK = 0
EXIT_ERROR = 1
EXIT_LOCKED = 2
EXIT_STORAGE = 3  # the storage cannot be used: I/O error, read-only file system, full disk
EXIT_CORRUPT = 4  # the storage is corrupt: restore it from a backup
SHUTDOWN_STEP_TIMEOUT = 15.0


def storage_exit_code(error: BaseException | None) -> int:
    """The exit code for a storage failure (`durable-bots` documents them): corrupt 4, other storage errors 3."""
    if isinstance(error, StorageCorrupt):
        return EXIT_CORRUPT
    return EXIT_STORAGE if isinstance(error, StorageError) else EXIT_ERROR


class BotError(Exception):
    """A problem the operator can act on; the message says what to do."""

    def __init__(self, message: str, exit_code: int = EXIT_ERROR) -> None:
        super().__init__(message)
        self.exit_code = exit_code


# --- models ------------------------------------------------------------------------------------------------


def build_models(ref: ModelRef, env: Mapping[str, str]) -> Models:
    """One provider, the one the config names. Keys and endpoints come from the environment only."""
    models = Models()
    if ref.provider == "openai":
        models.set_provider(OpenAIProvider(env.get("OPENAI_API_KEY"), env.get("OPENAI_BASE_URL") or None))
    elif ref.provider == "anthropic":
        models.set_provider(
            AnthropicProvider(env.get("ANTHROPIC_API_KEY"), env.get("ANTHROPIC_BASE_URL") or None)
        )
    elif ref.provider == "faux":
        models.set_provider(demo_provider(demo_delay(env)))
    else:  # the config validator allows nothing else
        raise BotError(f"unknown model provider {ref.provider!r}")
    return models


# --- tools: the ops tools plus plugin modules ----------------------------------------------------------------


def load_plugin(module_name: str, ctx: OpsContext | None) -> Extension:
    """A `[tools] modules` entry: a module with `extension` (an Extension, or a function of the OpsContext
    returning one)."""
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise BotError(f"cannot import tool module {module_name!r}: {exc}") from None
    found = getattr(module, "extension", None)
    if isinstance(found, Extension):
        return found
    if callable(found):
        result = found(ctx)
        if isinstance(result, Extension):
            return result
    raise BotError(
        f"tool module {module_name!r} has no `extension` (an Extension or a function returning one)"
    )


def known_tools(config: BotConfig) -> tuple[list[str], list[Problem]]:
    """Every tool the config can name (ops tools, `schedule`, plugin tools) and the problems loading them."""
    names = list(OPS_TOOLS)
    problems: list[Problem] = []
    for index, module_name in enumerate(config.tools.modules):
        try:
            extension = load_plugin(module_name, None)
        except BotError as exc:
            problems.append(config.problem(("tools", "modules", index), str(exc)))
            continue
        except Exception as exc:  # the plugin's own code failed
            problems.append(config.problem(("tools", "modules", index), f"loading it raised {exc!r}"))
            continue
        names.extend(t.name for t in extension.tools if t.name not in names)
    return names, problems


def enabled_tools(config: BotConfig, known: Sequence[str]) -> list[str]:
    return list(config.tools.enabled) if config.tools.enabled is not None else list(known)


def check_tools(config: BotConfig) -> list[Problem]:
    """Checks that need the plugin modules: enabled, gated and time-limited tool names must exist."""
    known, problems = known_tools(config)
    if problems:
        return problems
    for index, name in enumerate(config.tools.enabled or ()):
        if name not in known:
            problems.append(
                config.problem(
                    ("tools", "enabled", index), f"unknown tool {name!r}; known: {', '.join(known)}"
                )
            )
    for name in config.tools.timeouts:
        if name not in known:
            problems.append(
                config.problem(
                    ("tools", "timeouts", name), f"unknown tool {name!r}; known: {', '.join(known)}"
                )
            )
    for index, name in enumerate(config.approvals.tools):
        if name not in known:
            problems.append(
                config.problem(
                    ("approvals", "tools", index), f"unknown tool {name!r}; known: {', '.join(known)}"
                )
            )
    return problems


# --- the bridge's view of the config ----------------------------------------------------------------------


def bridge_config(config: BotConfig) -> BridgeConfig:
    answer = config.answer
    default = ChannelPolicy(
        answer=answer.mode,
        record_unaddressed=answer.record_unaddressed,
        reply_in_thread=answer.reply_in_thread,
    )
    channels = {
        channel: ChannelPolicy(
            answer=override.mode if override.mode is not None else default.answer,
            record_unaddressed=(
                override.record_unaddressed
                if override.record_unaddressed is not None
                else default.record_unaddressed
            ),
            reply_in_thread=(
                override.reply_in_thread if override.reply_in_thread is not None else default.reply_in_thread
            ),
        )
        for channel, override in config.channels.items()
    }
    return BridgeConfig(default=default, channels=channels, answer_dms=answer.dms)


def approval_policies(config: BotConfig) -> list[ApprovalPolicy]:
    approvals = config.approvals
    if not approvals.tools:
        return []
    return [
        ApprovalPolicy(
            tools=list(approvals.tools),
            approvers=list(approvals.approvers),
            groups=list(approvals.groups),
            allow_self_approval=approvals.allow_self_approval,
            expires_after_ms=int(approvals.expires_minutes * 60_000),
        )
    ]


def agent_change(config: BotConfig, tools: Sequence[str]) -> AgentChange:
    return AgentChange(model=config.bot.model_ref, instructions=config.bot.instructions, tools=list(tools))


# --- the runtime ---------------------------------------------------------------------------------------------


@dataclass
class Runtime:
    config: BotConfig
    env: Mapping[str, str]
    storage: Storage
    harness: Harness
    bridge: Bridge
    models: Models
    ops: OpsContext
    agent: AgentChange
    tools: list[str] = field(default_factory=list)

    async def close(self) -> None:
        await self.bridge.stop()
        await self.harness.close()
        await self.models.aclose()


def freeze_startup_heap() -> int:
    """Collect once, then move every object alive after startup (imported modules, config, the open harness
    and adapters) out of the garbage collector's reach; returns how many objects that was.

    They live as long as the process, yet each full collection would walk them again: with slack-sdk,
    discord.py and pydantic loaded, those passes took 30-70 ms and were charged to whatever message arrived
    meanwhile (see benchmarks/RESULTS.md, intake latency). Reference counting still frees them if dropped.
    """
    gc.collect()
    gc.freeze()
    return gc.get_freeze_count()


def locked_message(path: Path, exc: StorageLocked) -> str:
    pid, host = "?", "?"
    with contextlib.suppress(OSError, ValueError, TypeError, KeyError):
        info = json.loads(path.with_name(path.name + ".lock").read_text())
        pid, host = str(info["pid"]), str(info["host"])
    if pid == "?":
        return f"another durable-bots process ({exc.holder}) is using {path}; stop it first"
    return f"another durable-bots process (pid {pid}, host {host}) is using {path}; stop it first"


async def open_storage(
    config: BotConfig,
    env: Mapping[str, str],
    *,
    must_exist: bool = False,
    on_standby: Callable[[LeaseHolder], None] | None = None,
    read_only: bool = False,
) -> Storage:
    """Open the configured storage for writing: the SQLite file (owner lock) or PostgreSQL (lease). With
    `on_standby`, a PostgreSQL store whose lease another process holds is waited for (it is called once with
    the holder); without it, or on SQLite, a held store is `BotError` with exit code 2.

    `read_only`: a snapshot beside a running bot (operator reads): no owner lock, no lease, commits refused."""
    target = config.storage_target(env)
    if target.kind == "postgres":
        assert target.url is not None
        try:
            if read_only:
                return await PostgresStorage.open_read_only(target.url)
            if config.storage.partitions > 1:
                # Its partitions belong to the workers (`run`): operator commands read beside them and pass
                # retry/cancel/decide to the owner of the target's partition as requests.
                raise BotError(
                    f"the store is split into {config.storage.partitions} partitions, owned by the workers "
                    "(`durable-bots run`); only a worker opens it for writing",
                    EXIT_LOCKED,
                )
            return await PostgresStorage.open(
                target.url, lease_ttl=config.storage.lease_ttl, on_standby=on_standby
            )
        except StorageLocked as exc:
            raise BotError(
                f"another durable-bots process ({exc.holder}) owns {exc.path}; stop it first, or run the bot "
                "without --no-standby to wait as its standby",
                EXIT_LOCKED,
            ) from None
        except StorageError as exc:  # unreachable server, bad credentials, a schema too new: one line
            raise BotError(str(exc), storage_exit_code(exc)) from None
    path = target.path or config.storage_path
    if must_exist and not path.exists():
        raise BotError(f"there is no storage at {path} yet (has the bot run with this config?)")
    try:
        if read_only:
            return await SqliteStorage.open_read_only(path)
        return await SqliteStorage.open(path, durability=config.storage.durability)
    except StorageLocked as exc:
        raise BotError(locked_message(path, exc), EXIT_LOCKED) from None
    # StorageCorrupt / StorageError go up as they are: the CLI ends them with one line and exit 4 / 3.


async def open_runtime(
    config: BotConfig,
    env: Mapping[str, str],
    *,
    transport: httpx.AsyncBaseTransport | None = None,
    on_report: Callable[[BaseException], None] | None = None,
    must_exist: bool = False,
    read_only: bool = False,
    metrics: BotMetrics | None = None,
    on_standby: Callable[[LeaseHolder], None] | None = None,
) -> Runtime:
    """Open the storage (taking the owner lock or lease) and build harness, bridge and tools. Schedules
    nothing.

    `read_only`: open a snapshot of the storage without the owner lock, beside a running bot (operator
    reads); the harness then refuses every commit. `metrics`: measure model requests and commits."""
    problems = check_tools(config)
    if problems:
        raise BotError("\n".join(str(p) for p in problems))
    known, _ = known_tools(config)
    tools = enabled_tools(config, known)
    models = build_models(config.bot.model_ref, env)
    try:
        storage = await open_storage(
            config, env, must_exist=must_exist, on_standby=on_standby, read_only=read_only
        )
    except BaseException:
        await models.aclose()  # operator commands then open a read-only snapshot: leave no client behind
        raise
    if metrics is not None:
        for provider in models.providers():
            models.set_provider(metrics.provider(provider))
    registry = Registry()
    harness = await Harness.open(
        storage if metrics is None else metrics.storage(storage),
        models=models,
        registry=registry,
        settings=config.harness_settings(),
        on_report=on_report or _report,
        read_only=read_only,
    )
    agent = agent_change(config, tools)
    # PostgreSQL: no platform write goes out unless this process still safely owns the store.
    guard = storage.check_owner if isinstance(storage, PostgresStorage) else None
    bridge = Bridge(
        harness,
        config=bridge_config(config),
        agent=agent,
        approvals=approval_policies(config),
        write_guard=guard,
    )
    ctx = OpsContext(config=config, env=env, storage=storage, transport=transport)
    registry.install(ops_extension(ctx))
    registry.install(history_extension(ctx))
    registry.install(bridge.extension())
    for module_name in config.tools.modules:
        registry.install(load_plugin(module_name, ctx))
    return Runtime(config, env, storage, harness, bridge, models, ctx, agent, tools)


def _report(error: BaseException) -> None:
    log.warning("%s", error)


async def sync_agents(runtime: Runtime) -> int:
    """Bring every channel and thread conversation to the configured model, instructions and tools (a
    conversation stores its agent when created; a changed config should reach the old ones too)."""
    return await sync_conversations(runtime.harness, runtime.agent)


async def sync_conversations(harness: Harness, agent: AgentChange) -> int:
    """`sync_agents` for one harness (a worker runs one per partition)."""
    places = await harness.family(PlaceDoc)
    ids = sorted({int(v["conversation_id"]) for v in places.values() if v.get("conversation_id") is not None})
    changed: list[int] = []

    async def commit(tx: Tx) -> None:
        for conversation_id in ids:
            stored = await tx.snapshot(AgentDoc, conversation_id)
            if stored is None:
                continue
            wanted = agent.apply(stored)
            if wanted != stored:
                draft = await tx.doc(AgentDoc, conversation_id)
                draft.value = wanted
                changed.append(conversation_id)

    if ids:
        await harness.commit(commit)
    return len(changed)


# --- adapters ------------------------------------------------------------------------------------------------


def adapter_factory(config: BotConfig, name: str) -> AdapterFactory:
    module_name = config.adapter_module(name)
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if exc.name is not None and module_name.startswith(exc.name):
            raise BotError(f"adapter {name!r}: there is no module {module_name}") from None
        raise BotError(f"adapter {name!r}: importing {module_name} failed: {exc}") from None
    create = getattr(module, "create", None)
    if not callable(create):
        raise BotError(f"adapter {name!r}: {module_name} has no create(options, env) (not available yet?)")
    factory: AdapterFactory = create
    return factory


def adapter_names(config: BotConfig, requested: Sequence[str]) -> list[str]:
    """`--adapter` values in order (deduplicated); without any, every `[adapters.<name>]` table that is not
    `enabled = false`."""
    names = (
        list(dict.fromkeys(requested))
        if requested
        else [name for name in config.adapters if config.adapter_enabled(name)]
    )
    if not names:
        raise BotError(
            "no adapter to run: pass --adapter slack|discord|devchat or add an [adapters.<name>] table to "
            f"{config.source}"
        )
    return names


SECRET_ENV_NAMES = (
    "SLACK_BOT_TOKEN",
    "SLACK_APP_TOKEN",
    "SLACK_SIGNING_SECRET",
    "DISCORD_BOT_TOKEN",
    "SLACK_API_URL",
    "DISCORD_API_URL",
    "DISCORD_GATEWAY_URL",
)


def adapter_problem(config: BotConfig, name: str, exc: BaseException) -> Problem:
    """An adapter's `create()` refused its table: locate the key its message names (adapters word their
    errors as `adapters.<name>.<key>: ...` or `<key>: ...`), else point at the table."""
    message = str(exc)
    table = config.adapters.get(name, {})
    loc: tuple[str | int, ...] = ("adapters", name)
    found = re.search(rf"adapters\.{re.escape(name)}\.([A-Za-z0-9_]+)", message)
    if found is None:
        found = next(
            (
                m
                for m in re.finditer(r"(?:^|[\s;:])([A-Za-z0-9_]+)(?:\.[A-Za-z0-9_]+)*: ", message)
                if m.group(1) in table
            ),
            None,
        )
    if found is not None:
        loc = (*loc, found.group(1))
    return config.problem(loc, f"the {name} adapter refused it: {message}")


def env_problem(message: str) -> bool:
    """Whether an adapter's refusal is about the environment (a missing token), not the file."""
    return any(name in message for name in SECRET_ENV_NAMES)


def adapter_url(adapter: Adapter, options: Mapping[str, Any]) -> str | None:
    url = getattr(adapter, "url", None)
    if isinstance(url, str) and url:
        return url
    if adapter.name == "devchat":
        host = str(options.get("host", "127.0.0.1"))
        port = options.get("port", 8765)
        return f"http://{host}:{port}/"
    return None


# --- run ---------------------------------------------------------------------------------------------------


async def _open_unless_stopped(
    config: BotConfig,
    env: Mapping[str, str],
    stop: asyncio.Event,
    on_standby: Callable[[LeaseHolder], None] | None,
    metrics: BotMetrics | None = None,
) -> Runtime | None:
    """open_runtime(), given up (None) when `stop` is set first: a standby must leave on SIGTERM."""
    opening = asyncio.ensure_future(open_runtime(config, env, on_standby=on_standby, metrics=metrics))
    stopping = asyncio.ensure_future(stop.wait())
    try:
        await asyncio.wait({opening, stopping}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        stopping.cancel()
    if opening.done():
        return opening.result()
    opening.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        runtime = await opening
        await runtime.close()  # opened just as we were told to stop
    return None


ADMIN_BIND_WAIT = 5.0


async def _start_retrying(admin: AdminServer, wait: float) -> None:
    """Start the admin server, retrying for `wait` seconds while its port is taken (the leader this process
    replaces, on the same host, closes it a moment after releasing the lease)."""
    deadline = asyncio.get_running_loop().time() + wait
    while True:
        try:
            await admin.start()
            return
        except AdminError:
            if asyncio.get_running_loop().time() >= deadline:
                raise
            await asyncio.sleep(0.2)


class Console:
    """What `run` tells the operator: short lines on stdout, flushed (tests and supervisors read them)."""

    def __init__(self, stream: TextIO | None = None) -> None:
        self.stream = stream or sys.stdout

    def say(self, text: str) -> None:
        print(redact_text(text), file=self.stream, flush=True)  # a URL in an error may carry credentials


async def run_bot(
    config: BotConfig,
    requested: Sequence[str],
    env: Mapping[str, str],
    *,
    console: Console | None = None,
    stop: asyncio.Event | None = None,
    standby: bool = True,
    role: str = "worker",
    cli_args: Sequence[str] = (),
) -> int:
    """Run until SIGTERM/SIGINT (or `stop` is set): adapters stop first (no new intake), then the bridge,
    then the harness closes (running work is signalled and joined; nothing counts as a crash).

    On PostgreSQL a store another process owns is waited for as its standby (no platform connection until
    the lease is ours), unless `standby` is False (exit code 2, like SQLite). Losing the lease while running
    (paused past the ttl, cut off) stops the process at once, without writing anything more.

    `role="intake"`: the separate intake process a worker starts (`bots.intake_process`); `cli_args` are the
    command-line options a worker repeats for it."""
    console = console or Console()
    install_log_redaction()
    names = adapter_names(config, requested)
    ambiguous = approver_problems(config, names)  # `--adapter` may run more adapters than the config enables
    if ambiguous:
        raise BotError("; ".join(str(problem) for problem in ambiguous))
    target = config.storage_target(env)
    workers = target.kind == "postgres" and config.storage.partitions > 1
    separate = workers and config.workers.intake == "separate"
    if role == "intake":
        if not separate:
            raise BotError(
                "--role intake is the separate intake process of a worker: it needs a PostgreSQL store split "
                'into partitions and [workers] intake = "separate"'
            )
        from bots.intake_process import SEPARATE_ADAPTERS

        names = [name for name in names if name in SEPARATE_ADAPTERS]
    if workers:
        from bots.intake_process import intake_adapter_options
        from bots.shards import worker_adapter_options  # late: the worker modules build on this one
        from bots.workers import refuse_devchat

        refuse_devchat(config, names)
    factories = {name: adapter_factory(config, name) for name in names}
    adapters: list[tuple[Adapter, dict[str, Any]]] = []
    for name in names:
        options = config.adapter_options(name)
        if workers:
            options = worker_adapter_options(name, options)
        if separate:
            options = intake_adapter_options(name, options, child=role == "intake")
        try:
            adapter = factories[name](options, env)
        except Exception as exc:
            raise BotError(str(adapter_problem(config, name, exc))) from None
        adapters.append((adapter, options))
    if role == "intake":
        from bots.intake_process import run_intake

        assert target.url is not None
        return await run_intake(config, adapters, env, target.url, console=console, stop=stop)
    if workers:  # a store split into partitions: this process is one of the workers sharing them
        from bots.intake_process import SEPARATE_ADAPTERS, child_argv
        from bots.workers import run_workers

        assert target.url is not None
        intake_argv = None
        if separate and any(name in SEPARATE_ADAPTERS for name in names):
            intake_argv = child_argv(
                [*cli_args, *(f"--adapter={n}" for n in names if n in SEPARATE_ADAPTERS)]
            )
        return await run_workers(
            config, adapters, env, target.url, console=console, stop=stop, intake_argv=intake_argv
        )
    metrics = BotMetrics()
    started: list[Adapter] = []
    phase = ["starting"]  # readiness: "starting" -> "" (ready) -> "stopping"
    opened: list[Runtime] = []
    holders: list[str] = []

    async def readiness() -> dict[str, str]:
        if not opened:  # a standby is alive (healthz 200) but must not count as ready
            return {"bot": f"standby: the lease is held by {holders[-1]}" if holders else "starting"}
        return await readiness_of(opened[0].harness, started, phase, opened[0].storage)()

    try:
        admin = AdminServer(config.admin.address, metrics, readiness, env) if config.admin.address else None
    except AdminError as exc:  # the token rule: refused before anything is opened
        raise BotError(str(exc)) from None
    stop = stop or asyncio.Event()
    loop = asyncio.get_running_loop()
    received: list[str] = []

    def on_signal(signum: int) -> None:
        if received:
            # A second signal while stopping: leave at once. Safe: every step is committed before it shows.
            console.say("durable-bots: second signal, exiting now (work resumes on the next start)")
            os._exit(EXIT_ERROR)
        received.append(signal.Signals(signum).name)
        stop.set()

    installed: list[int] = []
    for signum in (int(signal.SIGTERM), int(signal.SIGINT)):
        with contextlib.suppress(NotImplementedError, RuntimeError):
            loop.add_signal_handler(signum, on_signal, signum)
            installed.append(signum)

    # SIGHUP's default action ends the process: a standby (or a bot still starting) must survive a reload
    # request too. One that came before the bot runs is applied right after it runs.
    early_reloads: list[bool] = []

    def on_early_reload() -> None:
        early_reloads.append(True)
        console.say("durable-bots: reload requested before the bot runs; applying it once it does")

    with contextlib.suppress(NotImplementedError, RuntimeError, AttributeError):
        loop.add_signal_handler(signal.SIGHUP, on_early_reload)
        installed.append(int(signal.SIGHUP))

    def on_standby(holder: LeaseHolder) -> None:
        holders.append(holder.describe())
        console.say(
            f"durable-bots: standby: the lease is held by {holder.describe()}; taking over when it ends"
        )

    # The admin endpoint answers from the start, a standby included: a liveness probe (Kubernetes, two
    # replicas) would otherwise restart the standby forever. Its port may be the leader's (two instances on
    # one host, one config): then it is taken once the leader is gone.
    admin_up = False
    if admin is not None:
        with contextlib.suppress(AdminError):
            await admin.start()
            admin_up = True
            console.say(f"admin: {admin.url} (healthz, readyz, metrics)")
    try:
        runtime = await _open_unless_stopped(config, env, stop, on_standby if standby else None, metrics)
    except BaseException:
        for signum in installed:
            loop.remove_signal_handler(signum)
        if admin_up and admin is not None:
            await admin.stop()
        raise
    if runtime is None:  # stopped while waiting as a standby: nothing was opened
        for signum in installed:
            loop.remove_signal_handler(signum)
        if admin_up and admin is not None:
            await admin.stop()
        console.say("durable-bots: stopped while on standby")
        return EXIT_OK
    opened.append(runtime)
    lease = runtime.storage.lease if isinstance(runtime.storage, PostgresStorage) else None
    console.say(
        f"durable-bots: {config.bot.name} starting (pid {os.getpid()}, model {config.bot.model}, "
        f"storage {runtime.storage.description})"
    )
    if admin is not None and not admin_up:
        try:
            await _start_retrying(admin, ADMIN_BIND_WAIT)  # a leader that just left may still hold it
        except AdminError as exc:
            for signum in installed:
                loop.remove_signal_handler(signum)
            await runtime.close()
            raise BotError(str(exc)) from None
        console.say(f"admin: {admin.url} (healthz, readyz, metrics)")
    unbind_metrics = metrics.bind(runtime.harness, runtime.bridge, started)
    # Operator requests (retry/cancel/decide from the command line) need a backend that carries them.
    desk = (
        OperatorDesk(runtime.storage, runtime.harness, runtime.bridge)
        if isinstance(runtime.storage, OperatorRequests)
        else None
    )
    # PostgreSQL: finished operator requests (and ingress records) are pruned by whoever writes the store.
    pruner = StorePruner(runtime.storage.store) if isinstance(runtime.storage, PostgresStorage) else None
    reloads = Reloads(runtime, console.say)
    with contextlib.suppress(NotImplementedError, RuntimeError, AttributeError):
        loop.add_signal_handler(signal.SIGHUP, reloads.request)
        if int(signal.SIGHUP) not in installed:
            installed.append(int(signal.SIGHUP))
    code = EXIT_OK
    try:
        await runtime.bridge.start()
        updated = await sync_agents(runtime)
        if updated:
            console.say(f"durable-bots: updated model/instructions/tools of {updated} conversation(s)")
        for adapter, options in adapters:
            try:
                await adapter.start(runtime.bridge)
            except Exception as exc:
                log.exception("adapter %s failed to start", adapter.name)
                raise BotError(f"adapter {adapter.name!r} failed to start: {exc}") from None
            started.append(adapter)
            summary = getattr(adapter, "catch_up_summary", None)  # "stopping for maintenance loses nothing"
            if isinstance(summary, str) and summary:
                console.say(f"{adapter.name}: {summary}")
            url = adapter_url(adapter, options)
            if url is not None:
                console.say(f"{adapter.name}: {redact_url(url)}")
        runtime.harness.resume()
        if desk is not None:
            desk.start()
        if pruner is not None:
            pruner.start()
        freeze_startup_heap()
        inspection = await runtime.harness.inspect()
        parked = inspection.parked()
        if parked:
            ids = ", ".join(str(t.record.id) for t in parked)
            console.say(f"durable-bots: {len(parked)} parked task(s) ({ids}): see `durable-bots inspect`")
        phase[0] = ""
        if early_reloads:
            reloads.request()
        console.say(
            f"durable-bots: ready ({', '.join(a.name for a in started)}); stop with Ctrl-C or SIGTERM"
        )
        closed: asyncio.Future[Any] = asyncio.ensure_future(asyncio.shield(runtime.harness.closed))
        stopping: asyncio.Future[Any] = asyncio.ensure_future(stop.wait())
        waits = {closed, stopping}
        lost: asyncio.Future[Any] | None = None
        if lease is not None:
            lost = asyncio.ensure_future(asyncio.shield(lease.lost))
            waits.add(lost)
        done, _ = await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
        stopping.cancel()
        if lost is not None and lost not in done:
            lost.cancel()
        if lost is not None and lost in done:
            closed.cancel()
            # Another process owns the store now: it carries on with the work; we must write nothing more.
            console.say(f"durable-bots: {lost.result()}; exiting without writing anything more")
            code = EXIT_ERROR
        elif closed in done:
            info = closed.result()
            console.say(f"durable-bots: the storage failed ({info.reason}: {info.error}); exiting")
            code = storage_exit_code(info.error)
        else:
            closed.cancel()
            why = received[0] if received else "stop requested"
            console.say(f"durable-bots: stopping ({why}): intake first, then running work settles")
    finally:
        phase[0] = "stopping"
        if desk is not None:
            await desk.stop()
        if pruner is not None:
            await pruner.stop()
        await reloads.stop()
        for adapter in reversed(started):
            try:
                await asyncio.wait_for(adapter.stop(), SHUTDOWN_STEP_TIMEOUT)
            except Exception as exc:
                log.warning("adapter %s did not stop cleanly: %r", adapter.name, exc)
            health = health_of(adapter)
            if health is not None and health.connections_opened:
                console.say(f"{adapter.name}: {health.summary()}")
        try:
            await asyncio.wait_for(runtime.close(), SHUTDOWN_STEP_TIMEOUT * 2)
        except Exception as exc:
            log.warning("closing the harness: %r", exc)
            code = EXIT_ERROR
        unbind_metrics()
        if admin is not None:
            await admin.stop()
        for signum in installed:
            loop.remove_signal_handler(signum)
    if code == EXIT_OK:
        console.say("durable-bots: stopped cleanly")
    return code
