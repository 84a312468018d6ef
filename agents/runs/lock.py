"""One writer per run folder: an exclusive `flock` on RUN_DIR/.lock, taken before anything else is read or written
for the run (before the data is loaded) and held for the run's life.

    lock = RunLock.acquire("runs/x")      # RunLocked (naming the holder's PID and host) if another process holds it
    ...
    lock.release()                         # or release(discard=True) after a failure at start-up

The kernel drops a `flock` when its holder exits, however it exits (kill -9 included), so a lock left by a dead
process never blocks; the file itself stays, holding the last holder's PID, host and start time for the message
a second writer gets. Between opening the file and locking it another process may have removed it (a start-up
failure discarding its new folder), so the lock is only kept if the path still names the locked file.
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import socket
import time
from pathlib import Path

LOCK_FILE = ".lock"


class RunLocked(RuntimeError):
    """Another live process holds the run folder; the message names its PID and host."""


class RunLock:
    def __init__(self, run_dir: Path, fd: int, created: bool, before: set[str]):
        self.run_dir = run_dir
        self._fd: int | None = fd
        self.created = created  # this lock made the run folder
        self._before = before  # what the folder held when the lock was taken

    @classmethod
    def acquire(cls, run_dir: str | Path, create: bool = True,
                reason: str = "a second writer would mix its checkpoints and metrics") -> "RunLock":
        """Locks the run folder (creating it if `create`); raises RunLocked if a live process holds it, its message
        ending with `reason` (why a second writer may not)."""
        run_dir = Path(run_dir)
        path = run_dir / LOCK_FILE
        if not create and not run_dir.is_dir():
            raise FileNotFoundError(f"{run_dir} is not a folder; is it a run folder made by scripts/train.py?")
        while True:
            created = not run_dir.exists()
            run_dir.mkdir(parents=True, exist_ok=True)
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)
                raise RunLocked(f"{run_dir} is in use by {_holder(path)}; wait for it to end or stop it ({reason})"
                                ) from None
            try:
                if os.fstat(fd).st_ino == os.stat(path).st_ino:
                    break
            except FileNotFoundError:
                pass
            os.close(fd)  # the file was removed while we waited: lock the one now there
        holder = {"pid": os.getpid(), "host": socket.gethostname(), "since": time.strftime("%Y-%m-%d %H:%M:%S")}
        os.ftruncate(fd, 0)
        os.pwrite(fd, json.dumps(holder).encode(), 0)
        before = {p.name for p in run_dir.iterdir()} - {LOCK_FILE}
        return cls(run_dir, fd, created, before)

    @property
    def held(self) -> bool:
        return self._fd is not None

    def release(self, discard: bool = False) -> None:
        """Unlocks. `discard` (a failure at start-up): first removes what the run wrote since the lock was taken,
        the folder itself if the lock made it, so the same --run-dir can be used again."""
        if self._fd is None:
            return
        try:
            if discard:
                if self.created:
                    shutil.rmtree(self.run_dir, ignore_errors=True)
                else:
                    for path in self.run_dir.iterdir():
                        if path.name in self._before or path.name == LOCK_FILE:
                            continue
                        if path.is_dir():
                            shutil.rmtree(path, ignore_errors=True)
                        else:
                            path.unlink(missing_ok=True)
        finally:
            os.close(self._fd)  # closing drops the flock
            self._fd = None


def _holder(path: Path) -> str:
    """'PID 123 on host h (since ...)' from the lock file; the holder writes it just after locking."""
    for _ in range(20):
        try:
            holder = json.loads(path.read_text())
            return f"PID {holder['pid']} on host {holder['host']} (since {holder['since']})"
        except (OSError, ValueError, KeyError, TypeError):
            time.sleep(0.05)
    return "another process (its PID and host were not written)"
