"""Processes the tests look for in /proc: a trainer's sidecar children, and whether a process still runs."""

from __future__ import annotations

import os
from pathlib import Path


def children(pid: int, marker: bytes = b"llm_sidecar") -> list[int]:
    """Live processes whose parent is `pid` and whose command line holds `marker`."""
    out = []
    for entry in filter(str.isdigit, os.listdir("/proc")):
        try:
            stat = Path(f"/proc/{entry}/stat").read_text().split(")")[-1].split()
            if int(stat[1]) == pid and stat[0] != "Z" and marker in Path(f"/proc/{entry}/cmdline").read_bytes():
                out.append(int(entry))
        except (OSError, IndexError, ValueError):
            pass
    return out


def running(pid: int) -> bool:
    """The process exists and is not a zombie."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0] != "Z"
    except OSError:
        return False
