"""`reload_config` in process: what a SIGHUP changes in the running bot, and what it leaves for a restart."""

from __future__ import annotations

from pathlib import Path

from bots_cli_support import bot_env, write_config

from bots.config import load_config
from bots.reload import reload_config
from bots.runtime import open_runtime


async def test_reload_applies_answer_approvals_tools_and_instructions_and_names_the_rest(
    tmp_path: Path,
) -> None:
    path = write_config(tmp_path)
    config = load_config(path)
    runtime = await open_runtime(config, bot_env(tmp_path))
    said: list[str] = []
    try:
        fresh = (
            path.read_text()
            .replace('mode = "all"', 'mode = "none"')
            .replace('approvers = ["U-lead"]', 'approvers = ["U-lead", "U-second"]')
            .replace('model = "faux:demo"', 'model = "openai:gpt-4o"\ninstructions = "Be terse."')
            .replace("[tools]\n", '[tools]\nenabled = ["search_logs", "fragile"]\n', 1)
        )
        path.write_text(fresh)
        applied = await reload_config(runtime, said.append)
        assert applied is not None, said
        assert runtime.bridge.config.default.answer == "none"
        assert runtime.bridge.approvals.policies[0].approvers == ["U-lead", "U-second"]
        assert runtime.agent.instructions == "Be terse." and runtime.agent.tools == ["search_logs", "fragile"]
        assert runtime.agent.model == config.bot.model_ref  # the model needs a restart
        assert any("applied only after a restart: bot (model, name)" in line for line in said), said

        path.write_text(fresh.replace('mode = "none"', 'mode = "sometimes"'))
        assert await reload_config(runtime, said.append) is None
        assert "reload refused, 1 problem(s)" in said[-1]
        assert runtime.bridge.config.default.answer == "none"  # unchanged
    finally:
        await runtime.close()
