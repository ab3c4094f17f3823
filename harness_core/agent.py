"""Per-conversation agent configuration (`core.agent`) and its resolution against the registry.

The document stores names only: model, thinking level, extension and tool names, instructions, cwd. Resolution
turns names into the installed code; names that are not installed are skipped (and come back when installed).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal, TypeVar

from harness_core.extensions import Extension, Registry, Section
from harness_core.models import ModelRef, ThinkingLevel
from harness_core.settings import HarnessSettings
from harness_core.tools import ToolSpec

T = TypeVar("T")


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


def _merge_in_place(items: list[T], name: Callable[[T], str]) -> list[T]:
    positions: dict[str, int] = {}
    merged: list[T] = []
    for item in items:
        index = positions.get(name(item))
        if index is None:
            positions[name(item)] = len(merged)
            merged.append(item)
        else:
            merged[index] = item
    return merged


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

    # A later extension's tool or section of the same name replaces the earlier one in place.
    tools = _merge_in_place([t for e in extensions for t in e.tools], lambda t: t.name)
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

    sections = _merge_in_place([s for e in extensions for s in e.sections], lambda s: s.key)
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
