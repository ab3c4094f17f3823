"""`make run` from a fresh clone: the shipped config/ops.toml serves devchat and the bot answers a message.

The first test runs the Makefile's command (`python -m bots run --config config/ops.toml --adapter devchat`)
over a copy of the shipped config whose storage, chat store and tracker live in a temporary directory and whose
port is 0 (a free one; the CLI prints the URL it got); then SIGTERM must stop everything cleanly. The second
runs `make run` itself, steered only by the environment (`CONFIG`, the Makefile's own variable, for that copy
and `DEVCHAT_PORT` for a free port), and stops it with Ctrl-C (SIGINT to the whole process group, as a
terminal does). In both, the page's own websocket protocol carries one message in and the answer out.
"""

from __future__ import annotations

import asyncio
import os
import signal
from pathlib import Path

import pytest
from bots_cli_support import REPO, BotProcess, bot_env, devchat_converse, free_port, shipped_config_in

pytestmark = pytest.mark.slow


async def test_make_run_serves_devchat_and_answers_a_message(tmp_path: Path) -> None:
    config = shipped_config_in(tmp_path)
    bot = await BotProcess.start(config, "--adapter", "devchat", env=bot_env(tmp_path))
    try:
        line = await bot.wait_for(lambda text: text.startswith("devchat: http://"), timeout=60)
        assert line is not None, f"{bot.output()}\n{await bot.stderr()}"
        url = line.split()[1]
        answer = await asyncio.wait_for(devchat_converse(url), 60)
        assert answer["author"] == "ops-bot" and answer["channel"] == "general"
        assert answer["text"].startswith("Hi alice! I am the ops bot running the offline demo model")
        assert await bot.terminate() == 0, await bot.stderr()
    finally:
        await bot.kill()
    assert "durable-bots: stopped cleanly" in bot.output()


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


async def test_make_run_itself_prints_the_url_answers_and_stops_on_ctrl_c(tmp_path: Path) -> None:
    # Only the install step of `make run` is left out of the test: it needs the network on a fresh clone. The
    # venv is there already when the suite runs (`make test` made it); then make goes straight to the command.
    question = await asyncio.create_subprocess_exec(
        "make", "--question", ".venv/.installed", cwd=REPO, stdout=asyncio.subprocess.DEVNULL
    )
    if await question.wait() != 0:
        pytest.fail(
            "the .venv install stamp is out of date: run `make .venv/.installed` (or `make test`) first"
        )
    port = free_port()
    config = shipped_config_in(tmp_path, port=8765)  # the shipped port: DEVCHAT_PORT must win over it
    env = {k: v for k, v in bot_env(tmp_path).items() if k not in ("MAKEFLAGS", "MFLAGS", "MAKELEVEL")}
    env.update(CONFIG=str(config), DEVCHAT_PORT=str(port))
    process = await asyncio.create_subprocess_exec(
        "make",
        "run",
        cwd=REPO,
        env=env,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        start_new_session=True,  # its own process group, so SIGINT reaches make and the bot like Ctrl-C
    )
    make = BotProcess(process)
    try:
        started = await make.wait_for(lambda text: text.startswith("durable-bots: ops-bot starting (pid"), 30)
        assert started is not None, f"{make.output()}\n{await make.stderr()}"
        bot_pid = int(started.split("(pid ")[1].split(",")[0])
        assert bot_pid != process.pid  # the bot is make's child, not make
        url = f"http://127.0.0.1:{port}/"
        assert await make.wait_for(lambda text: text == f"devchat: {url}", 30) is not None, make.output()
        assert await make.wait_for(lambda text: text.startswith("durable-bots: ready"), 30) is not None
        answer = await asyncio.wait_for(devchat_converse(url), 30)
        assert answer["author"] == "ops-bot"
        assert answer["text"].startswith("Hi alice! I am the ops bot running the offline demo model")

        os.killpg(process.pid, signal.SIGINT)
        code = await make.finish(30)
    finally:
        if process.returncode is None:
            os.killpg(process.pid, signal.SIGKILL)
            await process.wait()
    output = make.output()
    assert "durable-bots: stopping (SIGINT)" in output and "durable-bots: stopped cleanly" in output, output
    # make itself dies of the SIGINT (GNU make re-raises it) once its child, the bot, has exited.
    assert code in (0, -signal.SIGINT), (code, output)
    assert not pid_alive(bot_pid), "make returned while the bot was still running"
    assert (tmp_path / "ops.sqlite").exists() and (tmp_path / "devchat.sqlite").exists()  # not ./var
