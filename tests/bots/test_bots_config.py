"""Config validation: every problem names the file, the line and the key; secrets are refused; `check-config`
exits 0 on a good file and 1 on a broken one (run in-process through `bots.cli.main`)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bots.cli import main
from bots.config import ConfigError, key_lines, load_config, parse_config, storage_url_problem
from bots.runtime import bridge_config

REPO = Path(__file__).resolve().parents[2]


def problems(text: str) -> list[str]:
    with pytest.raises(ConfigError) as caught:
        parse_config(text, "bot.toml")
    return [str(p) for p in caught.value.problems]


def test_wrong_type_names_the_key_and_its_line() -> None:
    text = '[bot]\nname = "ops"\n\n[approvals]\napprovers = ["lead"]\nexpires_minutes = "soon"\n'
    (problem,) = problems(text)
    assert problem.startswith("bot.toml:6: approvals.expires_minutes: ")
    assert "valid number" in problem and "'soon'" in problem


def test_unknown_key_is_an_error_that_lists_the_allowed_keys() -> None:
    (problem,) = problems('[storage]\npath = "x.sqlite"\ndurabilty = "full"\n')
    assert (
        problem
        == "bot.toml:3: storage.durabilty: unknown key (allowed here: path, durability, url, lease_ttl, partitions)"
    )


def test_unknown_table_and_unknown_key_in_a_channel_override() -> None:
    text = '[answer]\nmode = "all"\n\n[channels."C 42"]\nmode = "sometimes"\nanswr = 1\n\n[bots]\nx = 1\n'
    assert problems(text) == [
        "bot.toml:5: channels.\"C 42\".mode: Input should be 'mentions', 'all' or 'none' (got 'sometimes')",
        'bot.toml:6: channels."C 42".answr: unknown key (allowed here: mode, record_unaddressed, reply_in_thread)',
        "bot.toml:8: bots: unknown key (allowed here: bot, storage, workers, answer, channels, tools, approvals, "
        "deploy, logs, tickets, retry, compaction, tasks, admin, logging, adapters)",
    ]


@pytest.mark.parametrize(
    ("model", "expected"),
    [
        ("gpt-4o", "model must look like 'provider:model'"),
        ("mistral:large", "unknown model provider 'mistral'"),
        ("faux:faux-1", "the faux provider only has the offline demo script 'faux:demo'"),
    ],
)
def test_bad_model_strings(model: str, expected: str) -> None:
    (problem,) = problems(f'# the model\n[bot]\nmodel = "{model}"\n')
    assert problem.startswith("bot.toml:3: bot.model: ") and expected in problem


def test_a_secret_key_is_refused_with_the_env_var_to_use() -> None:
    text = '[bot]\nmodel = "openai:gpt-4o"\napi_key = "abc"\n\n[adapters.slack]\nmode = "socket"\nbot_token = "x"\n'
    assert problems(text) == [
        "bot.toml:3: bot.api_key: secrets do not belong in the config file: remove this key and set "
        "OPENAI_API_KEY in the environment instead",
        "bot.toml:7: adapters.slack.bot_token: secrets do not belong in the config file: remove this key and set "
        "SLACK_BOT_TOKEN in the environment instead",
    ]


def test_a_value_that_looks_like_a_token_is_refused_wherever_it_is() -> None:
    (problem,) = problems('[adapters.discord]\nnote = "xoxb-1234-5678-abcdef"\n')
    assert problem.startswith("bot.toml:2: adapters.discord.note: this value looks like a Slack token")
    assert "SLACK_BOT_TOKEN" in problem


def test_token_counts_are_not_secrets() -> None:
    config = parse_config(
        "[compaction]\nreserve_tokens = 1000\nkeep_recent_tokens = 2000\n[approvals]\ntools = []\n"
    )
    assert config.harness_settings().compaction.reserve_tokens == 1000


def test_a_webhook_url_with_credentials_is_refused() -> None:
    (problem,) = problems('[deploy]\nwebhook_url = "https://user:pw@deploy.example/hook"\n')
    assert problem.startswith("bot.toml:2: deploy.webhook_url: ") and "DEPLOY_WEBHOOK_TOKEN" in problem


def test_toml_syntax_errors_name_the_line() -> None:
    (problem,) = problems('[bot]\nname = "ops"\nmodel = \n')
    assert problem.startswith("bot.toml:3: TOML syntax error: ")


def test_nobody_to_approve_an_enabled_gated_tool_is_an_error() -> None:
    (problem,) = problems('[approvals]\ntools = ["deploy"]\n')
    assert problem.startswith("bot.toml:1: approvals.approvers: nobody may approve deploy")
    parse_config('[tools]\nenabled = ["search_logs"]\n')  # deploy is not enabled: nothing to approve


def test_line_scanner_ignores_what_multiline_strings_and_arrays_contain() -> None:
    text = (
        '[bot]\ninstructions = """\n[storage]\npath = "not a key"\n"""\nname = "x"\n'
        'tags = [\n  "a",\n  "[b]",\n]\n[adapters.devchat]\nport = 1\nopts = { a = 1 }\n'
    )
    lines = key_lines(text)
    assert lines[("bot", "name")] == 6
    assert ("storage",) not in lines
    assert lines[("adapters", "devchat", "port")] == 12
    assert lines[("adapters", "devchat", "opts")] == 13


def test_channel_overrides_inherit_the_answer_table() -> None:
    config = parse_config(
        '[answer]\nmode = "mentions"\nreply_in_thread = true\n\n[channels.C1]\nmode = "all"\n[approvals]\n'
        'approvers = ["U1"]\n'
    )
    bridge = bridge_config(config)
    assert bridge.default.answer == "mentions" and bridge.default.reply_in_thread
    assert bridge.channels["C1"].answer == "all" and bridge.channels["C1"].reply_in_thread


def test_missing_file_is_reported() -> None:
    with pytest.raises(ConfigError) as caught:
        load_config("/nonexistent/bot.toml")
    assert "cannot read the config file" in str(caught.value)


# --- check-config -----------------------------------------------------------------------------------------


def test_check_config_exit_codes(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    broken = tmp_path / "broken.toml"
    broken.write_text('[bot]\nmodel = "faux:demo"\n\n[answer]\nmode = "loud"\n')
    assert main(["check-config", "--config", str(broken)]) == 1
    captured = capsys.readouterr()
    assert f"{broken}:5: answer.mode: " in captured.err and captured.out == ""

    good = tmp_path / "good.toml"
    good.write_text(f'[storage]\npath = "{tmp_path / "x.sqlite"}"\n[approvals]\napprovers = ["lead"]\n')
    assert main(["check-config", "--config", str(good)]) == 0
    out = capsys.readouterr().out
    assert f"{good}: OK" in out and "model faux:demo (offline demo script)" in out
    assert not (tmp_path / "x.sqlite").exists(), "check-config never creates the storage"


def test_check_config_finds_unknown_tool_names(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "bot.toml"
    path.write_text('[tools]\nenabled = ["search_logs", "deploi"]\n\n[approvals]\napprovers = ["x"]\n')
    assert main(["check-config", "--config", str(path)]) == 1
    err = capsys.readouterr().err
    assert f"{path}:2: tools.enabled[1]: unknown tool 'deploi'" in err


def test_check_config_locates_a_key_the_adapter_refuses(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "bot.toml"
    path.write_text(
        '[approvals]\napprovers = ["lead"]\n\n[adapters.devchat]\nhost = "127.0.0.1"\nport = 99999\n'
    )
    assert main(["check-config", "--config", str(path)]) == 1
    err = capsys.readouterr().err
    assert f"{path}:6: adapters.devchat.port: the devchat adapter refused it: " in err


def test_check_config_warns_about_missing_secrets_without_failing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("DISCORD_BOT_TOKEN", raising=False)
    monkeypatch.delenv("ANTHROPIC_API_KEY", raising=False)
    path = tmp_path / "bot.toml"
    path.write_text(
        '[bot]\nmodel = "anthropic:claude-sonnet-4-5"\n[approvals]\napprovers = ["1"]\n[adapters.discord]\n'
    )
    assert main(["check-config", "--config", str(path)]) == 0
    out = capsys.readouterr().out
    assert "warning: ANTHROPIC_API_KEY is not set" in out and "DISCORD_BOT_TOKEN is not set" in out


@pytest.mark.parametrize("name", ["ops.toml", "ops.example-slack.toml", "ops.example-discord.toml"])
def test_shipped_configs_are_valid(name: str, capsys: pytest.CaptureFixture[str]) -> None:
    cwd = Path.cwd()
    os.chdir(REPO)  # relative paths in the shipped files are relative to the repository root
    try:
        assert main(["check-config", "--config", f"config/{name}"]) == 0
    finally:
        os.chdir(cwd)
    assert "OK" in capsys.readouterr().out


def test_check_config_never_prints_webhook_credentials_or_query(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    # Procfile's release phase runs check-config: whatever it prints lands in deploy logs.
    monkeypatch.setenv(
        "DEPLOY_WEBHOOK_URL", "https://deployer:hunter2@deploy.example/hook?token=s3cret&env=prod"
    )
    path = tmp_path / "bot.toml"
    path.write_text('[approvals]\napprovers = ["lead"]\n')
    assert main(["check-config", "--config", str(path)]) == 0
    out = capsys.readouterr().out
    assert "deploy: webhook https://***@deploy.example/hook?token=***&env=***" in out
    assert "hunter2" not in out and "s3cret" not in out and "deployer" not in out


def test_bare_approver_ids_are_refused_as_ambiguous_when_several_adapters_run() -> None:
    several = '[approvals]\napprovers = ["lead", "slack:U0LEAD"]\ngroups = ["S1"]\n[adapters.slack]\n[adapters.devchat]\n'
    assert problems(several) == [
        "bot.toml:2: approvals.approvers[0]: 'lead' is ambiguous with several adapters (slack, devchat): write "
        "it as '<platform>:lead', e.g. 'slack:lead'",
        "bot.toml:3: approvals.groups[0]: 'S1' is ambiguous with several adapters (slack, devchat): write it as "
        "'<platform>:S1', e.g. 'slack:S1'",
    ]
    one = parse_config('[approvals]\napprovers = ["lead"]\n[adapters.devchat]\n', "bot.toml")
    assert one.approvals.approvers == ["lead"]  # one platform: a bare id is still accepted
    (unknown,) = problems('[approvals]\napprovers = ["slak:U0LEAD"]\n')
    assert unknown.startswith("bot.toml:2: approvals.approvers[0]: unknown platform 'slak' in 'slak:U0LEAD'")


async def test_run_refuses_bare_approvers_when_adapter_flags_start_several(tmp_path: Path) -> None:
    from bots.runtime import BotError, run_bot

    config = parse_config(f'[storage]\npath = "{tmp_path / "x.sqlite"}"\n[approvals]\napprovers = ["lead"]\n')
    with pytest.raises(BotError) as caught:
        await run_bot(config, ["devchat", "slack"], {})
    assert "approvals.approvers[0]: 'lead' is ambiguous with several adapters (devchat, slack)" in str(
        caught.value
    )
    assert not (tmp_path / "x.sqlite").exists()


def test_check_config_refuses_a_remote_devchat_without_a_token_and_warns_with_one(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("DEVCHAT_TOKEN", raising=False)
    path = tmp_path / "bot.toml"
    path.write_text(
        '[approvals]\napprovers = ["lead"]\n[adapters.devchat]\nhost = "0.0.0.0"\nallow_remote = true\n'
    )
    assert main(["check-config", "--config", str(path)]) == 1
    assert "DEVCHAT_TOKEN" in capsys.readouterr().err
    monkeypatch.setenv("DEVCHAT_TOKEN", "a-long-random-devchat-token")
    assert main(["check-config", "--config", str(path)]) == 0
    out = capsys.readouterr().out
    assert "warning: devchat: devchat listens on 0.0.0.0" in out and "unauthenticated names" in out
    assert "a-long-random-devchat-token" not in out


@pytest.mark.parametrize(
    ("toml", "key", "what"),
    [
        (
            '[bot]\ninstructions = "post with xoxb-1234-5678-abcdefgh please"\n',
            "bot.instructions",
            "a Slack token",
        ),
        ('[bot]\ninstructions = "refresh: xoxe.xoxp-1-Mi0yLTEyMzQ"\n', "bot.instructions", "a Slack refresh"),
        (
            '[bot]\ninstructions = "MTA1MjM0NTY3ODkwMTIzNDU2Nzg5.GaBcDe.abcdefghijklmnopqrstuvwxyz0123"\n',
            "bot.instructions",
            "a Discord bot token",
        ),
        (
            '[deploy]\nwebhook_url = "https://deploy.example/hook?token=abc123"\n',
            "deploy.webhook_url",
            "a URL carrying a credential in its query",
        ),
        (
            '[adapters.devchat]\nnote = "https://hooks.slack.com/services/T0/B0/XXXXXXXX"\n',
            "adapters.devchat.note",
            "a Slack incoming-webhook URL",
        ),
    ],
)
def test_secrets_inside_values_are_found(toml: str, key: str, what: str) -> None:
    found = problems(toml + "[approvals]\ntools = []\n")
    assert any(p.startswith(f"bot.toml:2: {key}: this value looks like {what}") for p in found), found
    assert all("abc123" not in p and "XXXXXXXX" not in p for p in found)  # the secret is not repeated


def test_ordinary_text_and_urls_are_not_secrets() -> None:
    config = parse_config(
        '[bot]\ninstructions = "Check https://status.example/?page=2 and the sk-learn docs; token counts matter."\n'
        '[deploy]\nwebhook_url = "https://deploy.example/hooks/deploy?env=prod"\n[approvals]\ntools = []\n'
    )
    assert config.deploy.webhook_url == "https://deploy.example/hooks/deploy?env=prod"


# --- choosing the storage ----------------------------------------------------------------------------------

NO_GATES = "[approvals]\ntools = []\n"


def test_storage_url_path_and_database_url_choose_the_storage() -> None:
    database_url = {"DATABASE_URL": "postgresql://bot:pw@db.internal/ops"}
    named = parse_config(NO_GATES + '[storage]\nurl = "postgresql://bot@db/ops"\nlease_ttl = 4\n')
    target = named.storage_target(database_url)
    assert (target.kind, target.url, target.source) == ("postgres", "postgresql://bot@db/ops", "config")
    assert named.storage.lease_ttl == 4
    # Nothing named: the 12-factor DATABASE_URL; a named path wins over it.
    fallback = parse_config(NO_GATES).storage_target(database_url)
    assert (fallback.kind, fallback.url, fallback.source) == (
        "postgres",
        database_url["DATABASE_URL"],
        "DATABASE_URL",
    )
    path = parse_config(NO_GATES + '[storage]\npath = "x.sqlite"\n').storage_target(database_url)
    assert (path.kind, path.path) == ("sqlite", Path("x.sqlite").absolute())
    default = parse_config(NO_GATES).storage_target({})
    assert (default.kind, default.path) == ("sqlite", Path("var/ops.sqlite").absolute())
    sqlite_url = parse_config(NO_GATES + '[storage]\nurl = "sqlite:///var/other.sqlite"\n')
    assert sqlite_url.storage_target({}).path == Path("var/other.sqlite").absolute()
    assert sqlite_url.storage_path == Path("var/other.sqlite").absolute()
    assert parse_config(NO_GATES).storage_target({"DATABASE_URL": "sqlite:////tmp/a.sqlite"}).path == Path(
        "/tmp/a.sqlite"
    )


def test_storage_url_problems_are_named_without_echoing_the_url() -> None:
    (password,) = problems(NO_GATES + '[storage]\nurl = "postgresql://bot:s3cret@db/ops"\n')
    assert password.startswith("bot.toml:4: storage.url: the URL holds a password")
    assert "DATABASE_URL" in password and "s3cret" not in password
    (scheme,) = problems(NO_GATES + '[storage]\nurl = "mysql://db/ops"\n')
    assert "must start with postgresql://" in scheme
    (both,) = problems(NO_GATES + '[storage]\nurl = "postgresql://db/ops"\npath = "x.sqlite"\n')
    assert "either path (a SQLite file) or url, not both" in both
    (ttl,) = problems(NO_GATES + "[storage]\nlease_ttl = 0\n")
    assert ttl.startswith("bot.toml:4: storage.lease_ttl: ")
    assert parse_config(NO_GATES).storage.partitions == 64
    assert parse_config(NO_GATES + "[storage]\npartitions = 1\n").storage.partitions == 1
    for wrong in ("0", "1025", '"many"'):
        (partitions,) = problems(NO_GATES + f"[storage]\npartitions = {wrong}\n")
        assert partitions.startswith("bot.toml:4: storage.partitions: "), partitions
    with pytest.raises(ConfigError) as caught:
        parse_config(NO_GATES).storage_target({"DATABASE_URL": "redis://:hunter2@cache/0"})
    assert "DATABASE_URL" in str(caught.value) and "hunter2" not in str(caught.value)


@settings(max_examples=200, deadline=None)
@given(
    url=st.text(max_size=60)
    | st.builds(lambda p: f"postgresql://u:{p}@h/db", st.text(min_size=1, max_size=20))
)
def test_any_database_url_is_a_storage_or_a_problem_that_never_echoes_it(url: str) -> None:
    config = parse_config(NO_GATES)
    problem = storage_url_problem(url) if url else None
    if problem is not None:
        with pytest.raises(ConfigError) as caught:
            config.storage_target({"DATABASE_URL": url})
        # A fixed sentence: never the URL itself, which may hold a password.
        assert str(caught.value) == f"environment: DATABASE_URL: {problem}"
        return
    target = config.storage_target({"DATABASE_URL": url})
    if url:
        assert (target.kind in ("postgres", "sqlite"), target.source) == (True, "DATABASE_URL")
    else:
        assert (target.kind, target.source) == ("sqlite", "config")  # empty: as if unset


def test_check_config_names_a_postgresql_store_without_its_password(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "bot.toml"
    path.write_text('[approvals]\napprovers = ["lead"]\n')
    monkeypatch.setenv("DATABASE_URL", "postgresql://bot:hunter2@db.internal:6432/ops?sslmode=require")
    assert main(["check-config", "--config", str(path)]) == 0
    out = capsys.readouterr().out
    assert "  storage: PostgreSQL postgresql://bot@db.internal:6432/ops (from DATABASE_URL) (lease ttl" in out
    assert "(lease ttl 10 s, 64 partitions shared by the workers)" in out
    assert "hunter2" not in out

    monkeypatch.setenv("DATABASE_URL", "mysql://bot:hunter2@db.internal/ops")
    assert main(["check-config", "--config", str(path)]) == 1
    captured = capsys.readouterr()
    assert "DATABASE_URL" in captured.err and "postgresql://" in captured.err and captured.out == ""
    assert "hunter2" not in captured.err


def test_check_config_names_every_missing_slack_secret_at_once(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in ("SLACK_BOT_TOKEN", "SLACK_APP_TOKEN", "SLACK_SIGNING_SECRET"):
        monkeypatch.delenv(name, raising=False)
    path = tmp_path / "bot.toml"
    path.write_text('[approvals]\napprovers = ["U1"]\n[adapters.slack]\nmode = "socket"\n')
    assert main(["check-config", "--config", str(path)]) == 0
    out = capsys.readouterr().out
    assert "SLACK_BOT_TOKEN is not set" in out and "SLACK_APP_TOKEN is not set" in out  # both, in one run


def test_workers_worker_nice_is_a_niceness_from_0_to_19() -> None:
    assert problems("[workers]\nworker_nice = 20\n") == [
        "bot.toml:2: workers.worker_nice: Input should be less than or equal to 19 (got 20)"
    ]
    assert problems("[workers]\nworker_nice = -5\n") == [
        "bot.toml:2: workers.worker_nice: Input should be greater than or equal to 0 (got -5)"
    ]
    assert not [p for p in problems("[workers]\nworker_nice = 0\n") if "worker_nice" in p]


def test_workers_intake_names_its_two_choices() -> None:
    assert problems('[workers]\nintake = "both"\n') == [
        "bot.toml:2: workers.intake: Input should be 'shared' or 'separate' (got 'both')"
    ]
