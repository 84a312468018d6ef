"""Writing a run folder so that a failed write loses nothing already written: whole-line appends, atomic rewrites,
and one error that says what failed and how much space is left.

A run that cannot write (disk full, quota, I/O error) stops at once with `RunWriteError`; nothing half-written is
left for `--resume` to trip over.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path


class RunWriteError(RuntimeError):
    """A write to the run folder failed; the message says what, why, the free space and what is still good."""


def format_bytes(n: float) -> str:
    for unit in ("bytes", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            break
        n /= 1024
    return f"{n:.0f} {unit}" if unit == "bytes" else f"{n:.1f} {unit}"


def free_bytes(path: str | Path) -> tuple[int | None, Path]:
    """Free bytes on the file system holding `path` (its nearest existing parent), and that parent."""
    path = Path(path).absolute()
    while not path.exists() and path != path.parent:
        path = path.parent
    try:
        return shutil.disk_usage(path).free, path
    except OSError:
        return None, path


def free_space(path: str | Path) -> str:
    """'1.2 MiB free on DIR' for the file system holding `path`."""
    free, where = free_bytes(path)
    return f"free space on {where} unknown" if free is None else f"{format_bytes(free)} free on {where}"


def allocated_bytes(folder: str | Path) -> int:
    """Disk space the files under `folder` take (allocated blocks, as `du` counts them)."""
    return sum(p.lstat().st_blocks * 512 for p in Path(folder).rglob("*") if p.is_file())


def reason(error: BaseException) -> str:
    """The first line of an error, as short as the user needs it (orbax and tensorstore errors run long)."""
    if isinstance(error, OSError) and error.strerror:
        return error.strerror
    text = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
    for marker in ("No space left on device", "RESOURCE_EXHAUSTED", "Disk quota exceeded", "Read-only file system"):
        if marker in text:
            return "No space left on device" if marker == "RESOURCE_EXHAUSTED" else marker
    return text[:200]


def _write(fd: int, data: bytes) -> int:
    """The one place a run's log lines reach the disk (tests inject write failures here)."""
    return os.write(fd, data)


def append_line(fd: int, line: str) -> None:
    """Appends one whole line to an O_APPEND file: a failed or short write is cut back off, never left torn."""
    data = line.encode()
    start = os.lseek(fd, 0, os.SEEK_END)
    done = 0
    try:
        while done < len(data):
            done += _write(fd, data[done:])
    except OSError:
        os.ftruncate(fd, start)
        raise


def replace_text(path: str | Path, text: str) -> None:
    """Rewrites a file atomically: a crash leaves the old contents or the new, never a mix."""
    path = Path(path)
    staging = path.with_name(path.name + ".tmp")
    try:
        with open(staging, "w") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(staging, path)
    except BaseException:
        staging.unlink(missing_ok=True)
        raise


def fsync_dir(path: str | Path) -> None:
    """Makes a folder's entries durable (a file created or renamed in it survives a crash)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
