"""`[tools] timeout` and `[tools.timeouts]`: validated with the key named, unknown tool names refused, and
handed to the harness as its per-tool time limits."""

from __future__ import annotations

from pathlib import Path

import pytest

from bots.cli import main
from bots.config import ConfigError, parse_config

BASE = '[approvals]\napprovers = ["lead"]\n'


def problems(text: str) -> list[str]:
    with pytest.raises(ConfigError) as caught:
        parse_config(BASE + text, "bot.toml")
    return [str(p) for p in caught.value.problems]


def test_time_limits_reach_the_harness_settings() -> None:
    default = parse_config(BASE).harness_settings().tools
    assert default.time_limit("search_logs", None) == 60.0
    config = parse_config(BASE + "[tools]\ntimeout = 5\n\n[tools.timeouts]\ndeploy = 300\n", "bot.toml")
    tools = config.harness_settings().tools
    assert tools.time_limit("search_logs", None) == 5
    assert tools.time_limit("deploy", None) == 300
    assert tools.time_limit("search_history", 300) == 300, "a tool's own limit beats the default"
    assert tools.time_limit("deploy", 10) == 300, "the per-tool setting beats the tool's own limit"


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("[tools]\ntimeout = 0\n", "bot.toml:4: tools.timeout: Input should be greater than 0"),
        ('[tools]\ntimeout = "1m"\n', "bot.toml:4: tools.timeout: Input should be a valid number"),
        (
            "[tools.timeouts]\ndeploy = -1\n",
            "bot.toml:4: tools.timeouts.deploy: Input should be greater than 0",
        ),
        (
            "[tools.timeouts]\ndeploy = inf\n",
            "bot.toml:4: tools.timeouts.deploy: Input should be a finite number",
        ),
    ],
)
def test_bad_time_limits_name_the_key_and_line(text: str, expected: str) -> None:
    (problem,) = problems(text)
    assert problem.startswith(expected), problem


def test_check_config_refuses_a_time_limit_for_an_unknown_tool(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "bot.toml"
    path.write_text(BASE + "\n[tools.timeouts]\nsearch_logs = 10\nserch_logs = 10\n")
    assert main(["check-config", "--config", str(path)]) == 1
    err = capsys.readouterr().err
    assert f"{path}:6: tools.timeouts.serch_logs: unknown tool 'serch_logs'" in err
    assert "search_logs = 10" not in err and "tools.timeouts.search_logs" not in err
