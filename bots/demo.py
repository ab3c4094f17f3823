"""`faux:demo`: a scripted stand-in for a real model, so the whole ops flow runs with no API key.

The responder is a pure function of the request (the transcript since the last user message, the tool results
in it, the tools offered), so a restarted process that resends a request gets the same answer: exactly what a
durable harness needs from a model in tests and demos. What it does, by the last user message:

- an incident ("checkout is throwing errors", "payments is slow"): `search_logs` → reads the matches → if a
  fixed build of the failing service is ready, explains and suggests the deploy (it never deploys on its own);
  with no fix ready it calls `open_ticket` instead;
- "deploy checkout 1.4.3", and only that: `deploy` (gated: the call's result says it awaits approval, so the
  turn ends and the channel goes on); the decision arrives later as a message of its own ("(approval #12)
  ..."), which is reported: the deploy's result, or a denial, expiry or withdrawal as what it is;
- "open a ticket for ...": `open_ticket`; "remind me in 2 minutes to ...": `schedule`;
- "what did we say about checkout earlier?": `search_history` (whose subagent calls `lookup_conversations`);
- `/call <tool> {json}`: calls any enabled tool by hand (handy for trying tools);
- anything else: a plain answer that explains the demo.

Answers stream in small chunks with a delay (`DURABLE_BOTS_DEMO_DELAY_MS`, default 40 ms per 6 characters),
slow enough to kill the process mid-answer during the README tour.
"""

from __future__ import annotations

import json
import re
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from bots.ops import HISTORY_PREFIX, HISTORY_TOOL
from harness_core.messages import (
    AssistantMessage,
    TextContent,
    ToolCall,
    ToolResultMessage,
    UserMessage,
    user_text,
)
from harness_core.models import ModelRequest
from harness_core.models.faux import FauxProvider, faux_assistant, faux_text, faux_tool_call

DEFAULT_DELAY_MS = 40.0
CHUNK_SIZE = 6

_INCIDENT = re.compile(
    r"\b(errors?|fail(s|ing|ed|ures?)?|broken|down|5\d\d|5xx|slow|incident|alert(s|ing)?|exceptions?|"
    r"crash(es|ing)?|time ?outs?|outage|logs?|investigate|wrong|npe)\b"
)
_HISTORY = re.compile(
    r"\b(earlier|history|last time|did (we|anyone|someone)|remember|previously|who said|what was said)\b"
)
_DEPLOY = re.compile(r"\bdeploy\s+([a-z][\w-]*)\s+(?:version\s+|v)?(\d[\w.\-]*)", re.IGNORECASE)
_REMIND = re.compile(
    r"\b(remind|schedule|reminder|in \d+(\.\d+)? ?(s|sec|secs|seconds?|m|min|mins|minutes?|h|hours?))\b"
)
_DELAY = re.compile(r"\bin (\d+(?:\.\d+)?) ?(s|sec|secs|seconds?|m|min|mins|minutes?|h|hours?)\b")
_CALL = re.compile(r"^/call\s+([A-Za-z_][\w-]*)\s*(.*)$", re.DOTALL)
_LOG_LINE = re.compile(r"^(?P<file>[^:]+):\d+: \S+ (?P<service>\S+) (?P<level>[A-Z]+) (?P<text>.*)$")
_RELEASE = re.compile(r"release (?P<service>\S+) (?P<version>\S+) ready: (?P<what>.*)$")
_STOP = {
    "what", "when", "where", "which", "who", "whom", "whose", "why", "how", "did", "does", "was", "were",
    "the", "and", "for", "about", "with", "that", "this", "there", "their", "have", "has", "had", "say",
    "said", "tell", "earlier", "history", "before", "last", "time", "anyone", "someone", "remember",
    "previously", "you", "your", "our", "ours", "any", "all", "from", "into", "can", "could", "would",
    "should", "please", "again", "yesterday", "today", "talk", "talked", "mention", "mentioned", "discuss",
    "discussed", "we", "us",
}  # fmt: skip


def demo_provider(delay_ms: float | None = None, *, chunk_size: int = CHUNK_SIZE) -> FauxProvider:
    """A FauxProvider (provider "faux") answering every request with the demo script."""
    provider = FauxProvider(
        chunk_size=chunk_size,
        delay_ms=DEFAULT_DELAY_MS if delay_ms is None else delay_ms,
        record_requests=False,
    )
    provider.set_responder(respond)
    return provider


def demo_delay(env: Mapping[str, str]) -> float | None:
    raw = env.get("DURABLE_BOTS_DEMO_DELAY_MS")
    if raw is None or not raw.strip():
        return None
    try:
        return max(0.0, float(raw))
    except ValueError:
        return None


@dataclass
class Turn:
    """The request as the script sees it: who asked what, and what the tools said since."""

    speaker: str
    text: str
    results: list[ToolResultMessage]
    tools: set[str]
    messages: int

    @property
    def last(self) -> ToolResultMessage | None:
        return self.results[-1] if self.results else None

    def call(self, name: str, arguments: dict[str, object], preface: str = "") -> AssistantMessage:
        parts: list[TextContent | ToolCall] = [faux_text(preface)] if preface else []
        parts.append(faux_tool_call(name, dict(arguments), id=f"call_{self.messages}_{name}"))
        return faux_assistant(parts, stop_reason="toolUse")


def respond(request: ModelRequest) -> AssistantMessage:
    messages = request.messages
    users = [i for i, m in enumerate(messages) if isinstance(m, UserMessage)]
    tools = {t.name for t in request.tools}
    if not users:
        return faux_assistant(
            "Hello! Ask me about an incident, a ticket, a reminder or earlier conversations."
        )
    first = user_text(messages[users[0]])  # type: ignore[arg-type]
    raw = user_text(messages[users[-1]])  # type: ignore[arg-type]
    if raw.startswith(GATE_OUTCOME_PREFIX):
        return faux_assistant(_gate_outcome(raw))
    speaker, _, text = raw.partition(": ")
    if not text:
        speaker, text = "", raw
    text = re.sub(r"<@[^>\s]+>|^\s*@[\w.-]+[,:]?", "", text).strip()  # mentions of the bot
    results = [m for m in messages[users[-1] + 1 :] if isinstance(m, ToolResultMessage)]
    turn = Turn(speaker=speaker, text=text, results=results, tools=tools, messages=len(messages))
    if first.startswith(HISTORY_PREFIX):
        return _history_child(turn, first.removeprefix(HISTORY_PREFIX))
    return _parent(turn)


def _parent(turn: Turn) -> AssistantMessage:
    text = turn.text
    lowered = text.lower()
    call = _CALL.match(text)
    if call:
        return _manual_call(turn, call.group(1), call.group(2))
    if raw_reminder := re.match(r"^\(scheduled\)\s*(.*)$", text, re.DOTALL):
        return faux_assistant(f"⏰ Reminder: {raw_reminder.group(1).strip()}")
    deploy = _DEPLOY.search(text)
    if deploy:
        return _explicit_deploy(turn, deploy.group(1).lower(), deploy.group(2))
    if _HISTORY.search(lowered):
        return _history(turn)
    if "ticket" in lowered:
        return _ticket(turn)
    if _REMIND.search(lowered):
        return _remind(turn)
    if _INCIDENT.search(lowered):
        return _incident(turn)
    return faux_assistant(_help(turn))


# --- flows -------------------------------------------------------------------------------------------------


def _missing(turn: Turn, tool: str) -> AssistantMessage:
    enabled = ", ".join(sorted(turn.tools)) or "none"
    return faux_assistant(
        f"I would use `{tool}` for that, but it is not enabled here (enabled tools: {enabled})."
    )


def _plain(result: ToolResultMessage) -> str:
    """A tool result's text without the harness's `<harness>[error] ...</harness>` wrapping."""
    text = result.text().strip()
    text = re.sub(r"^<harness>\s*(.*?)\s*</harness>$", r"\1", text, flags=re.DOTALL)
    return re.sub(r"^\[error\]\s*", "", text)


def _failure(result: ToolResultMessage) -> str:
    text = _plain(result)
    if "was interrupted" in text:
        return (
            f"The `{result.tool_name}` call was interrupted (the bot restarted while it ran), so I cannot tell "
            "whether it took effect. I will not repeat it blindly: please check before asking me again."
        )
    return f"`{result.tool_name}` failed: {text}"


def _manual_call(turn: Turn, name: str, raw_args: str) -> AssistantMessage:
    last = turn.last
    if last is not None:
        if last.is_error:
            return faux_assistant(_failure(last))
        return faux_assistant(f"`{last.tool_name}` returned:\n{last.text()}")
    if name not in turn.tools:
        return _missing(turn, name)
    try:
        arguments = json.loads(raw_args) if raw_args.strip() else {}
    except ValueError:
        return faux_assistant(f"The arguments for `{name}` are not valid JSON: {raw_args.strip()}")
    if not isinstance(arguments, dict):
        return faux_assistant(f"The arguments for `{name}` must be a JSON object.")
    return turn.call(name, arguments, f"Calling `{name}`.")


def _history(turn: Turn) -> AssistantMessage:
    last = turn.last
    if last is None:
        if "search_history" not in turn.tools:
            return _missing(turn, "search_history")
        return turn.call(
            "search_history",
            {"question": turn.text},
            "Let me ask a helper to go through earlier conversations.",
        )
    if last.is_error:
        return faux_assistant(_failure(last))
    return faux_assistant(f"Here is what the history search found:\n{last.text()}")


def _history_child(turn: Turn, question: str) -> AssistantMessage:
    words = [
        w for w in re.findall(r"[a-z0-9][a-z0-9_.-]*", question.lower()) if len(w) > 2 and w not in _STOP
    ]
    query = " ".join(dict.fromkeys(words)) or question
    last = turn.last
    if last is None:
        if HISTORY_TOOL not in turn.tools:
            return faux_assistant("I have no way to read earlier conversations here.")
        return turn.call(HISTORY_TOOL, {"query": query})
    if last.is_error:
        return faux_assistant(f"I could not search the history: {last.text()}")
    lines = last.text().splitlines()
    if len(lines) <= 1:
        return faux_assistant(f"Nothing said earlier mentions {query}.")
    top = "\n".join(f"- {line}" for line in lines[1:4])
    more = f" (and {len(lines) - 4} more)" if len(lines) > 4 else ""
    return faux_assistant(
        f"I found {len(lines) - 1} earlier message(s) about {query}{more}. The closest:\n{top}"
    )


def _ticket_title(text: str) -> str:
    match = re.search(r"ticket\s+(?:for|about|on|re:?)\s+(.+)$", text, re.IGNORECASE | re.DOTALL)
    title = (match.group(1) if match else text).strip().rstrip(".!?")
    return title[:1].upper() + title[1:80] if title else "Follow-up from chat"


def _ticket(turn: Turn) -> AssistantMessage:
    last = turn.last
    if last is None:
        if "open_ticket" not in turn.tools:
            return _missing(turn, "open_ticket")
        title = _ticket_title(turn.text)
        body = f"Requested in chat by {turn.speaker or 'someone'}: {turn.text}"
        return turn.call("open_ticket", {"title": title, "body": body}, "Opening a ticket.")
    if last.is_error:
        return faux_assistant(_failure(last))
    return faux_assistant(f"Done: {last.text()}.")


def _remind(turn: Turn) -> AssistantMessage:
    last = turn.last
    if last is None:
        if "schedule" not in turn.tools:
            return _missing(turn, "schedule")
        minutes = 1.0
        delay = _DELAY.search(turn.text.lower())
        if delay:
            amount = float(delay.group(1))
            unit = delay.group(2)
            minutes = amount / 60 if unit.startswith("s") else amount * 60 if unit.startswith("h") else amount
        about = re.search(r"\bto\s+(.+)$", turn.text, re.IGNORECASE | re.DOTALL)
        message = (about.group(1) if about else turn.text).strip().rstrip(".!")
        if turn.speaker:
            message = f"{turn.speaker}, {message}"
        return turn.call("schedule", {"message": message, "delay_minutes": max(minutes, 0.05)})
    if last.is_error:
        return faux_assistant(_failure(last))
    return faux_assistant(
        f"{last.text()} I will post the reminder here when it fires, even if I am restarted in between."
    )


@dataclass
class Findings:
    errors: dict[str, list[str]]
    releases: dict[str, tuple[str, str]]

    def most_common(self, service: str) -> str:
        return Counter(self.errors[service]).most_common(1)[0][0]

    def summary(self, service: str) -> str:
        errors = self.errors.get(service, [])
        if not errors:
            return ""
        common, count = Counter(errors).most_common(1)[0]
        text = (
            f"The logs show {len(errors)} error(s) from {service}; the most frequent ({count}x) is: {common}."
        )
        others = sorted(s for s in self.errors if s != service)
        if others:
            text += f" There are also errors from {', '.join(others)}."
        return text

    def focus(self, text: str) -> str | None:
        mentioned = [s for s in self.errors if re.search(rf"\b{re.escape(s)}\b", text.lower())]
        if mentioned:
            return mentioned[0]
        if not self.errors:
            return None
        return max(self.errors, key=lambda s: (len(self.errors[s]), s))


def read_findings(result: str) -> Findings:
    errors: dict[str, list[str]] = {}
    releases: dict[str, tuple[str, str]] = {}
    for line in result.splitlines():
        match = _LOG_LINE.match(line)
        if match is None:
            continue
        release = _RELEASE.search(match.group("text"))
        if release:
            releases[release.group("service")] = (release.group("version"), release.group("what"))
        elif match.group("level") in ("ERROR", "FATAL"):
            message = re.sub(r"\s*\([^)]*\)\s*$", "", match.group("text"))
            errors.setdefault(match.group("service"), []).append(message)
    return Findings(errors, releases)


def _incident(turn: Turn) -> AssistantMessage:
    last = turn.last
    if last is None:
        if "search_logs" not in turn.tools:
            return _missing(turn, "search_logs")
        return turn.call(
            "search_logs", {"pattern": "ERROR|release"}, "Let me check the logs for errors and recent builds."
        )
    if last.is_error:
        return faux_assistant(_failure(last))
    searched = next((r for r in turn.results if r.tool_name == "search_logs" and not r.is_error), None)
    findings = read_findings(searched.text() if searched else "")
    service = findings.focus(turn.text)
    if last.tool_name == "search_logs":
        if service is None:
            return faux_assistant(
                "The logs show no errors right now. If something still looks wrong, tell me which service "
                "and I will look closer, or ask me to open a ticket."
            )
        summary = findings.summary(service)
        common = findings.most_common(service)
        release = findings.releases.get(service)
        if release is not None and "deploy" in turn.tools:
            version, what = release
            # Deploys happen only on an explicit request: suggest it, never start one from a log search.
            return faux_assistant(
                f"{summary} Build {service} {version} is ready and should fix it ({what}). To deploy it, say "
                f"`deploy {service} {version}`: an approver then has to click Approve."
            )
        if "open_ticket" in turn.tools:
            title = f"{service}: {common}"[:80]
            body = f"{summary}\nReported in chat by {turn.speaker or 'someone'}: {turn.text}"
            return turn.call(
                "open_ticket",
                {"title": title, "body": body},
                f"{summary} No fixed build of {service} is ready, so I am opening a ticket.",
            )
        return faux_assistant(summary)
    # The answer replaces what was shown during the run: make it stand on its own.
    summary = findings.summary(service) if service else ""
    if last.tool_name == "deploy":
        version = findings.releases.get(service or "", ("?", ""))[0]
        return faux_assistant(f"{summary}\n{_deploy_report(last, service or 'the service', version)}".strip())
    if last.tool_name == "open_ticket":
        return faux_assistant(
            f"{summary}\nNo fixed build is ready, so I opened a ticket: {last.text()}. I will keep an eye on the "
            "error rate; ping me if it gets worse or if you want a deploy once a fix is built.".strip()
        )
    return faux_assistant(f"`{last.tool_name}` returned: {last.text()}")


def _explicit_deploy(turn: Turn, service: str, version: str) -> AssistantMessage:
    last = turn.last
    if last is None:
        if "deploy" not in turn.tools:
            return _missing(turn, "deploy")
        return turn.call(
            "deploy",
            {"service": service, "version": version},
            f"Requesting a deploy of {service} {version}; it runs only after an approver clicks Approve.",
        )
    return faux_assistant(_deploy_report(last, service, version))


def _deploy_report(result: ToolResultMessage, service: str, version: str) -> str:
    text = _plain(result)
    if not result.is_error and "awaits approval" in text:
        waiting = re.search(r"\((request #\d+; may approve: [^;]*); expires ([^)]*)\)", text)
        detail = f" ({waiting.group(1)}; it expires {waiting.group(2)})" if waiting else ""
        return (
            f"I asked to deploy {service} {version}; it waits for an approver{detail}. I will report here "
            "once it is decided. Meanwhile, ask me anything."
        )
    if not result.is_error:
        return (
            f"Deployed {service} {version} after approval. {text} I will watch the logs for the next few "
            "minutes; if the errors continue, ask me to look again or to open a ticket."
        )
    if "denied" in text:
        return f"The deploy of {service} {version} was not approved ({text}), so nothing was deployed."
    if "expired" in text or "not approved in time" in text:
        return f"Nobody approved the deploy of {service} {version} in time, so nothing was deployed."
    return _failure(result)


GATE_OUTCOME_PREFIX = "(approval #"
_GATE_OUTCOME = re.compile(
    r"^\(approval #(?P<gate>\d+)\) `(?P<call>[^`]*)` (?P<how>was approved by (?P<approver>.+?) and "
    r"(?P<ran>ran|failed)\. Result: (?P<result>.*)|was denied by (?P<denier>.+?);.*|expired without a "
    r"decision.*|was withdrawn by (?P<withdrawer>.+?);.*)$",
    re.DOTALL,
)


def _gate_outcome(raw: str) -> str:
    """Report a decided approval (a turn of its own): what was asked, and what came of it, as it is."""
    found = _GATE_OUTCOME.match(raw)
    if found is None:
        return f"An approval was decided: {raw}"
    words = found.group("call").split()
    tool, args = words[0], dict(w.split("=", 1) for w in words[1:] if "=" in w)
    what = f"the deploy of {args.get('service', '?')} {args.get('version', '')}".rstrip()
    if tool != "deploy":
        what = f"`{found.group('call')}`"
    ref = f"(request #{found.group('gate')})"
    if found.group("denier"):
        return (
            f"{what[:1].upper()}{what[1:]} {ref} was denied by {found.group('denier')}, so nothing was run."
        )
    if found.group("withdrawer"):
        return f"{found.group('withdrawer')} withdrew {what} {ref}; nothing was run."
    if found.group("approver") is None:
        return f"Nobody approved {what} {ref} in time (the request expired), so nothing was run."
    result = found.group("result").strip()
    if found.group("ran") == "ran":
        done = f"Done: {what} {ref} was approved by {found.group('approver')} and ran. {result}"
        if tool == "deploy":
            done += " I will watch the logs for a while; if the errors continue, ask me to look again."
        return done
    if "was interrupted" in result:
        return (
            f"{what[:1].upper()}{what[1:]} {ref} was approved by {found.group('approver')}, but the bot "
            "restarted while it ran, so I cannot tell whether it took effect. I will not repeat it blindly: "
            "please check before asking again."
        )
    return (
        f"{what[:1].upper()}{what[1:]} {ref} was approved by {found.group('approver')} but failed: {result}"
    )


def _help(turn: Turn) -> str:
    hello = f"Hi {turn.speaker}! " if turn.speaker else "Hi! "
    lines: Sequence[str] = (
        hello + "I am the ops bot running the offline demo model (faux:demo): a scripted stand-in for a real "
        "LLM, so all of this works without an API key. Things to try:",
        '- "checkout is throwing errors": I search the logs and suggest a fix; "deploy checkout 1.4.3" asks '
        "for the deploy, which an approver must click before it runs; I report the outcome here.",
        '- "open a ticket for the slow search page"',
        '- "remind me in 1 minute to check the dashboards"',
        '- "what did we say about checkout earlier?": a helper agent searches past conversations.',
        '- "/call search_logs {"pattern": "timeout"}": call any enabled tool by hand.',
        "Every step is committed to SQLite before it is shown: kill me mid-sentence (kill -9) and start me "
        "again, and I carry on where I was without running a tool twice.",
    )
    return "\n".join(lines)


__all__ = ["DEFAULT_DELAY_MS", "Findings", "demo_delay", "demo_provider", "read_findings", "respond"]
