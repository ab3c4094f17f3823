"""Extensions bundle what an agent can use: tools, system-prompt sections, hooks and task definitions.

Conversations store extension and tool *names* (in `core.agent`), never code, so a restarted process with the
same registry resolves the same agent, and installing an extension of the same name replaces it in place.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from harness_core.tasks import TaskDefinition
from harness_core.tools import ToolSpec

BUILTIN_TASK_NAMES = ("core.generation", "core.tool", "core.compaction")
_SECTION_KEY = re.compile(r"^[a-z][a-z0-9_-]*$")


@dataclass(frozen=True)
class PromptInput:
    conversation_id: int
    agent: Any  # ResolvedAgent
    env: Any


@dataclass(frozen=True, eq=False)
class Section:
    """A system-prompt section. `render` returns the text (or None to omit it); with `tag` the text is wrapped
    as `<key>...</key>`. Renderers must be deterministic: only changes are appended to the transcript."""

    key: str
    render: Callable[[PromptInput], Any]
    tag: bool = True


def section(key: str, render: Callable[[PromptInput], Any] | str, *, tag: bool = True) -> Section:
    if not _SECTION_KEY.match(key) or key == "instructions":
        raise ValueError(f"section key {key!r} must match [a-z][a-z0-9_-]* and not be 'instructions'")
    if isinstance(render, str):
        text = render

        def fixed(_prompt: PromptInput) -> str:
            return text

        return Section(key=key, render=fixed, tag=tag)
    return Section(key=key, render=render, tag=tag)


@dataclass(frozen=True, eq=False)
class Hook:
    task: str
    handlers: dict[str, Callable[..., Any]]


HOOK_NAMES: dict[str, frozenset[str]] = {
    "core.generation": frozenset({"before_request", "after_response", "on_yield", "after_tools"}),
    "core.tool": frozenset({"before_tool", "after_tool", "on_abort"}),
    "core.compaction": frozenset({"before_compact"}),
}


def hook(task: TaskDefinition | str, **handlers: Callable[..., Any]) -> Hook:
    """Contribute hooks to a task kind, e.g. `hook(ToolTask, before_tool=check)`."""
    name = task if isinstance(task, str) else task.name
    known = HOOK_NAMES.get(name)
    if known is not None:
        unknown = set(handlers) - known
        if unknown:
            raise ValueError(f"{name} has no hooks named {sorted(unknown)}; it has {sorted(known)}")
    return Hook(task=name, handlers=dict(handlers))


@dataclass(frozen=True, eq=False)
class Extension:
    name: str
    tools: Sequence[ToolSpec] = ()
    sections: Sequence[Section] = ()
    hooks: Sequence[Hook] = ()
    tasks: Sequence[TaskDefinition] = ()

    def __post_init__(self) -> None:
        for label, names in (
            ("tool", [t.name for t in self.tools]),
            ("section", [s.key for s in self.sections]),
        ):
            duplicates = {n for n in names if names.count(n) > 1}
            if duplicates:
                raise ValueError(f"extension {self.name}: duplicate {label} names {sorted(duplicates)}")


@dataclass
class Registry:
    """The installed extensions, in install order. Listeners run synchronously on every change."""

    _extensions: list[Extension] = field(default_factory=list)
    _listeners: list[Callable[[], None]] = field(default_factory=list)
    _builtin_tasks: dict[str, TaskDefinition] = field(default_factory=dict)

    def install(self, extension: Extension) -> None:
        builtin = set(self._builtin_tasks) | set(BUILTIN_TASK_NAMES)
        others = [e for e in self._extensions if e.name != extension.name]
        taken = builtin | {t.name for e in others for t in e.tasks}
        clash = [t.name for t in extension.tasks if t.name in taken]
        if clash:
            raise ValueError(f"extension {extension.name}: task names already defined: {clash}")
        for index, existing in enumerate(self._extensions):
            if existing.name == extension.name:
                self._extensions[index] = extension
                break
        else:
            self._extensions.append(extension)
        self._changed()

    def uninstall(self, name: str) -> None:
        self._extensions = [e for e in self._extensions if e.name != name]
        self._changed()

    def subscribe(self, listener: Callable[[], None]) -> Callable[[], None]:
        self._listeners.append(listener)
        return lambda: self._listeners.remove(listener) if listener in self._listeners else None

    def _changed(self) -> None:
        for listener in list(self._listeners):
            listener()

    def extensions(self) -> list[Extension]:
        return list(self._extensions)

    def extension(self, name: str) -> Extension | None:
        return next((e for e in self._extensions if e.name == name), None)

    def define_builtin(self, task: TaskDefinition) -> None:
        self._builtin_tasks[task.name] = task

    def task(self, name: str) -> TaskDefinition | None:
        found = self._builtin_tasks.get(name)
        if found is not None:
            return found
        for extension in self._extensions:
            for task in extension.tasks:
                if task.name == name:
                    return task
        return None
