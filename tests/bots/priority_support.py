"""Reading a process's CPU priority from /proc, for the tests of `bots.cpu_priority` (the product only sets it)."""

from __future__ import annotations

from pathlib import Path


def thread_nice(pid: int, tid: int | None = None) -> int:
    """The niceness of thread `tid` of process `pid` (its main thread when omitted)."""
    stat = Path(f"/proc/{pid}/task/{tid or pid}/stat").read_text()
    return int(stat.rsplit(")", 1)[1].split()[16])  # field 19 of stat; the name before ")" may hold spaces


def session_nice(pid: int) -> int | None:
    """The niceness of the autogroup of process `pid`'s session, or None without autogroup."""
    try:
        text = Path(f"/proc/{pid}/autogroup").read_text()
    except OSError:
        return None
    return int(text.rsplit("nice", 1)[1])
