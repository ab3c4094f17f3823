"""Per-conversation agent configuration (`core.agent`) and its resolution against the registry.

The document stores names only: model, thinking level, extension and tool names, instructions, cwd. Resolution
turns names into the installed code; names that are not installed are skipped (and come back when installed).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from harness_core.extensions import Extension, Registry, Section
from harness_core.models import ModelRef, ThinkingLevel
from harness_core.settings import HarnessSettings
from harness_core.tools import ToolSpec


class _Unset:
    def __repr__(self) -> str:
        return "UNSET"


UNSET: Any = _Unset()


@dataclass(frozen=True)
class ExtensionEdit:
    """Edit the default extension selection instead of naming every extension."""

    add: list[str] = field(default_factory=list)
    remove: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class ToolFilter:
    remove: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class AgentChange:
    """A change to a conversation's agent. Fields left UNSET stay; None clears the field."""

    model: ModelRef | None = UNSET
    thinking_level: ThinkingLevel | None = UNSET
    extensions: list[str | Extension] | ExtensionEdit | None = UNSET
    tools: list[str | ToolSpec] | ToolFilter | None = UNSET
    instructions: str | None = UNSET
    cwd: str | None = UNSET

    def apply(self, stored: dict[str, Any]) -> dict[str, Any]:
        out = dict(stored)
        for name in ("model", "thinking_level", "extensions", "tools", "instructions", "cwd"):
            value = getattr(self, name)
            if value is UNSET:
                continue
            if value is None:
                out.pop(name, None)
            else:
                out[name] = _to_json(value)
        return out


def _to_json(value: Any) -> Any:
    if isinstance(value, ModelRef):
        return {"provider": value.provider, "model_id": value.model_id}
    if isinstance(value, ExtensionEdit):
        return {"add": list(value.add), "remove": list(value.remove)}
    if isinstance(value, ToolFilter):
        return {"remove": list(value.remove)}
    if isinstance(value, list):
        return [v.name if isinstance(v, (Extension, ToolSpec)) else v for v in value]
    return value


@dataclass
class ResolvedAgent:
    model: ModelRef | None
    thinking_level: ThinkingLevel
    extensions: list[Extension]
    tools: list[ToolSpec]
    sections: list[Section]
    instructions: str | None
    cwd: str | None
    stored: dict[str, Any]

    def tool(self, name: str) -> ToolSpec | None:
        return next((t for t in self.tools if t.name == name), None)

    def hooks(self, task: str, name: str) -> list[Any]:
        found: list[Any] = []
        for extension in self.extensions:
            for contributed in extension.hooks:
                if contributed.task == task and name in contributed.handlers:
                    found.append(contributed.handlers[name])
        return found


def resolve_agent(stored: dict[str, Any], registry: Registry, settings: HarnessSettings) -> ResolvedAgent:
    installed = registry.extensions()
    by_name = {e.name: e for e in installed}
    base = list(settings.extensions) if settings.extensions is not None else [e.name for e in installed]
    selection = stored.get("extensions")
    names: list[str]
    if isinstance(selection, list):
        names = [str(n) for n in selection]
    elif isinstance(selection, dict):
        removed = set(selection.get("remove", []))
        names = [n for n in [*base, *selection.get("add", [])] if n not in removed]
    else:
        names = base
    seen: set[str] = set()
    extensions: list[Extension] = []
    for name in names:
        if name in by_name and name not in seen:
            seen.add(name)
            extensions.append(by_name[name])

    tools: list[ToolSpec] = []
    for extension in extensions:
        for spec in extension.tools:
            index = next((i for i, t in enumerate(tools) if t.name == spec.name), None)
            if index is None:
                tools.append(spec)
            else:
                tools[index] = spec
    tool_filter = stored.get("tools")
    if isinstance(tool_filter, list):
        by_tool = {t.name: t for t in tools}
        chosen: list[ToolSpec] = []
        for name in tool_filter:
            if name in by_tool and by_tool[name] not in chosen:
                chosen.append(by_tool[name])
        tools = chosen
    elif isinstance(tool_filter, dict):
        removed_tools = set(tool_filter.get("remove", []))
        tools = [t for t in tools if t.name not in removed_tools]

    sections: list[Section] = []
    for extension in extensions:
        for contributed in extension.sections:
            index = next((i for i, s in enumerate(sections) if s.key == contributed.key), None)
            if index is None:
                sections.append(contributed)
            else:
                sections[index] = contributed
    instructions = stored.get("instructions")
    if instructions:
        text = str(instructions)
        sections.append(Section(key="instructions", render=lambda _prompt: text, tag=True))

    model_json = stored.get("model")
    model = (
        ModelRef(provider=model_json["provider"], model_id=model_json["model_id"])
        if isinstance(model_json, dict)
        else None
    )
    level: ThinkingLevel = stored.get("thinking_level") or "off"
    return ResolvedAgent(
        model=model,
        thinking_level=level,
        extensions=extensions,
        tools=tools,
        sections=sections,
        instructions=str(instructions) if instructions else None,
        cwd=stored.get("cwd"),
        stored=stored,
    )


ExecutionMode = Literal["parallel", "sequential"]
