"""The devchat page in real headless Chromium (Debian `chromium` driven by Playwright) against a real bot process
(`server_process.py`: SQLite harness, slow-streaming faux model, approval-gated deploy, devchat adapter).

Waits use Playwright's auto-waiting `expect`; nothing asserts on durations. Without Chromium these tests fail
(CI installs it in `.ci/run`); they are never skipped.
"""

from __future__ import annotations

import os
import sqlite3
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from .server_process import STORY
from .support import ServerProcess, free_port

try:
    from playwright.async_api import Browser, Locator, Page, async_playwright, expect
except ImportError as exc:  # pragma: no cover - the dev extra installs it
    raise RuntimeError("the browser tests need the `playwright` package: pip install -e '.[dev]'") from exc

pytestmark = pytest.mark.browser

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]
CHROMIUM_INSTALLED = os.path.exists(CHROMIUM)
expect.set_options(timeout=20_000)

# Records every state a bot bubble in the channel goes through (id, final flag, text), so a test can tell that
# an answer streamed into one bubble and that no second bubble ever appeared, without sampling at the right time.
WATCH_BOT_BUBBLES = """
() => {
  window.__bot = [];
  const record = () => {
    for (const node of document.querySelectorAll('#messages > [data-kind="bot"]')) {
      const text = node.querySelector('[data-testid="text"]').textContent;
      const state = `${node.dataset.id}|${node.dataset.final}|${text}`;
      if (window.__bot[window.__bot.length - 1] !== state) window.__bot.push(state);
    }
  };
  new MutationObserver(record).observe(document.getElementById('messages'),
    { subtree: true, childList: true, characterData: true, attributes: true });
}
"""


@pytest.fixture
async def browser() -> AsyncIterator[Browser]:
    if not CHROMIUM_INSTALLED:
        pytest.fail(
            f"Chromium is not installed at {CHROMIUM}: the devchat browser tests need Debian's chromium "
            "(`apt-get install -y chromium`, which .ci/run does)"
        )
    async with async_playwright() as playwright:
        launched = await playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            yield launched
        finally:
            await launched.close()


@pytest.fixture
async def server(tmp_path: Path) -> AsyncIterator[ServerProcess]:
    process = ServerProcess(tmp_path, free_port(), approver="boss")
    await process.start()
    try:
        yield process
    finally:
        await process.stop()


class Tab:
    """One browser context (its own localStorage) with a display name."""

    def __init__(self, page: Page, name: str) -> None:
        self.page = page
        self.name = name
        self.errors: list[str] = []
        page.on("pageerror", lambda error: self.errors.append(str(error)))

    def channel(self) -> Locator:
        return self.page.locator('[data-testid="messages"] > [data-testid="message"]')

    def bot(self) -> Locator:
        return self.page.locator('[data-testid="messages"] > [data-kind="bot"]')

    def humans(self) -> Locator:
        return self.page.locator('[data-testid="messages"] > [data-kind="human"]')

    async def say(self, text: str) -> None:
        await self.page.get_by_test_id("composer-input").fill(text)
        await self.page.get_by_test_id("send").click()

    async def connected(self) -> None:
        await expect(self.page.get_by_test_id("status")).to_have_attribute("data-state", "connected")


async def open_tab(browser: Browser, server: ServerProcess, name: str, channel: str = "general") -> Tab:
    context = await browser.new_context()
    page = await context.new_page()
    tab = Tab(page, name)
    await page.goto(f"{server.url}#/{channel}")
    await page.get_by_test_id("name-input").fill(name)
    await page.get_by_test_id("name-save").click()
    await tab.connected()
    await expect(page.get_by_test_id("status")).to_have_text(f"connected as {name}")
    return tab


async def test_two_tabs_see_each_others_messages_and_one_streamed_answer(
    browser: Browser, server: ServerProcess
) -> None:
    alice = await open_tab(browser, server, "alice")
    bob = await open_tab(browser, server, "bob")
    await alice.page.evaluate(WATCH_BOT_BUBBLES)
    await alice.say("hello from alice")
    for tab in (alice, bob):
        said = tab.channel().filter(has_text="hello from alice")
        await expect(said).to_have_count(1)
        await expect(said.get_by_test_id("author")).to_have_text("alice")
    await bob.say("@bot what do you see?")
    answer = "I see: alice: hello from alice | bob: @bot what do you see?"
    for tab in (alice, bob):
        asked = tab.humans().filter(has_text="@bot what do you see?")
        await expect(asked.get_by_test_id("author")).to_have_text("bob")
        await expect(tab.bot()).to_have_count(1)
        await expect(tab.bot()).to_have_attribute("data-final", "true")
        await expect(tab.bot().get_by_test_id("text")).to_have_text(answer)
        await expect(tab.humans()).to_have_count(2)
    states: list[str] = await alice.page.evaluate("window.__bot")
    bubbles = {state.split("|", 1)[0] for state in states}
    partials = [s for s in states if s.split("|")[1] == "false"]
    assert len(bubbles) == 1, states  # one bubble, edited live
    assert partials, states  # it was shown while streaming
    assert states[-1].endswith(f"|true|{answer}")
    assert alice.errors == [] and bob.errors == []


async def test_a_thread_opens_a_fork_at_its_message(browser: Browser, server: ServerProcess) -> None:
    alice = await open_tab(browser, server, "alice")
    await alice.say("@bot first question")
    first_answer = "I see: alice: @bot first question"
    await expect(alice.bot().get_by_test_id("text")).to_have_text(first_answer)
    await expect(alice.bot()).to_have_attribute("data-final", "true")
    await alice.say("a later message in the channel")
    await expect(alice.humans().filter(has_text="a later message")).not_to_have_attribute(
        "data-pending", "true"
    )

    await alice.bot().get_by_test_id("open-thread").click()
    thread = alice.page.get_by_test_id("thread")
    await expect(thread).to_be_visible()
    await expect(alice.page.get_by_test_id("thread-parent")).to_contain_text(first_answer)
    await alice.page.get_by_test_id("thread-input").fill("tell me more")
    await alice.page.get_by_test_id("thread-send").click()

    replies = alice.page.locator('[data-testid="thread-messages"] > [data-kind="bot"]')
    await expect(replies).to_have_count(1)
    await expect(replies).to_have_attribute("data-final", "true")
    # The fork sees the channel up to the answer it hangs off, not the later channel message.
    await expect(replies.get_by_test_id("text")).to_have_text(
        "I see: alice: @bot first question | alice: tell me more"
    )
    await expect(alice.bot()).to_have_count(1)  # the thread answer stays in the thread
    await expect(alice.bot().get_by_test_id("open-thread")).to_have_text("2 replies")
    assert alice.errors == []


async def test_approve_by_the_configured_approver_runs_the_deploy_once(
    browser: Browser, server: ServerProcess
) -> None:
    alice = await open_tab(browser, server, "alice", "ops")
    carol = await open_tab(browser, server, "carol", "ops")
    boss = await open_tab(browser, server, "boss", "ops")
    await alice.say("@bot deploy api please")
    for tab in (alice, carol, boss):
        card = tab.page.get_by_test_id("approval")
        await expect(card).to_have_attribute("data-status", "pending")
        await expect(card.get_by_test_id("approval-args")).to_contain_text('"service": "api"')
    row = boss.page.get_by_test_id("approvals").get_by_test_id("approval-row")
    await expect(row).to_have_attribute("data-status", "pending")

    await carol.page.get_by_test_id("approve").click()
    await expect(carol.page.get_by_test_id("approval-notice")).to_contain_text("carol is not an approver")
    await expect(boss.page.get_by_test_id("approval-notice")).to_have_count(0)  # refusals are private
    await expect(alice.page.get_by_test_id("approval-notice")).to_have_count(0)
    assert server.deploys() == []

    await boss.page.get_by_test_id("approve").click()
    for tab in (alice, carol, boss):
        card = tab.page.get_by_test_id("approval")
        await expect(card).to_have_attribute("data-status", "approved")
        await expect(card.get_by_test_id("approval-status")).to_contain_text("Approved by boss at")
        await expect(card.get_by_test_id("approve")).to_have_count(0)
        answer = tab.bot().filter(has_text="Deploy finished")
        await expect(answer).to_have_attribute("data-final", "true")
        await expect(answer.get_by_test_id("text")).to_have_text(
            f"Deploy finished: deployed api (deploy-{server.deploys()[0].split('deploy-')[1]})"
        )
    await expect(row).to_have_attribute("data-status", "approved")
    await expect(row).to_contain_text("by boss")
    assert len(server.deploys()) == 1
    assert [t.errors for t in (alice, carol, boss)] == [[], [], []]


async def test_server_killed_mid_answer_restarts_and_the_page_shows_the_answer_once(
    browser: Browser, server: ServerProcess
) -> None:
    alice = await open_tab(browser, server, "alice")
    await alice.page.evaluate(WATCH_BOT_BUBBLES)
    await alice.say("@bot tell me a story")
    await expect(alice.bot()).to_have_attribute("data-final", "false")
    await expect(alice.bot().get_by_test_id("text")).to_contain_text("Once upon")

    await server.kill()
    with sqlite3.connect(server.workdir / "devchat.sqlite") as db:
        shown = db.execute("SELECT text, final FROM messages WHERE kind = 'bot'").fetchall()
    assert len(shown) == 1 and shown[0][1] == 0 and shown[0][0] != STORY  # killed mid-answer
    await expect(alice.page.get_by_test_id("status")).to_have_attribute("data-state", "reconnecting")

    await server.start()  # same port, same files
    await alice.connected()
    await expect(alice.bot().get_by_test_id("text")).to_have_text(STORY)
    await expect(alice.bot()).to_have_attribute("data-final", "true")
    await expect(alice.bot()).to_have_count(1)
    await expect(alice.humans()).to_have_count(1)
    states: list[str] = await alice.page.evaluate("window.__bot")
    assert len({state.split("|", 1)[0] for state in states}) == 1, states  # never a second bubble
    assert states[-1].endswith(f"|true|{STORY}")
    assert alice.errors == []
