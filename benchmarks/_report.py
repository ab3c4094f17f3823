"""What a benchmark hands back: figures (ours and the anchors'), ratios and goals, printed the same way."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any


@dataclass
class Figure:
    label: str
    value: float
    unit: str
    note: str = ""


@dataclass
class Goal:
    text: str
    met: bool | None  # None: not measured in this run
    detail: str = ""


@dataclass
class Report:
    name: str
    title: str
    design: str  # what exactly is timed, in one paragraph
    figures: list[Figure] = field(default_factory=list)
    goals: list[Goal] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    available: bool = True

    def add(self, label: str, value: float, unit: str, note: str = "") -> float:
        self.figures.append(Figure(label, value, unit, note))
        return value

    def ratio(self, label: str, ours: float, anchor: float, note: str = "") -> float:
        value = ours / anchor if anchor else float("nan")
        self.figures.append(Figure(label, value, "x", note))
        return value

    def goal(self, text: str, met: bool | None, detail: str = "") -> None:
        self.goals.append(Goal(text, met, detail))

    def note(self, text: str) -> None:
        self.notes.append(text)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    def render(self) -> str:
        lines = [f"== {self.name}: {self.title}", f"   {self.design}"]
        width = max((len(f.label) for f in self.figures), default=0)
        for figure in self.figures:
            note = f"  ({figure.note})" if figure.note else ""
            lines.append(f"   {figure.label:<{width}}  {_number(figure.value):>12} {figure.unit}{note}")
        for goal in self.goals:
            mark = "n/a " if goal.met is None else ("MET " if goal.met else "MISS")
            detail = f": {goal.detail}" if goal.detail else ""
            lines.append(f"   [{mark}] {goal.text}{detail}")
        lines.extend(f"   note: {text}" for text in self.notes)
        return "\n".join(lines)


def _number(value: float) -> str:
    if value != value:  # NaN
        return "n/a"
    if abs(value) >= 100 or value == int(value):
        return f"{value:,.0f}"
    if abs(value) >= 1:
        return f"{value:,.2f}"
    return f"{value:.4f}"
