"""The command line every script shares: flags spelled out in full (argparse's prefix matching would take
`--total_step` for `--total-steps` without a word), and a mistyped flag answered in one line that names the closest
flag, e.g. `--lr` → `--ppo.lr`."""

from __future__ import annotations

import argparse
import difflib
import json
import re
import sys
from pathlib import Path


class CommandParser(argparse.ArgumentParser):
    """argparse.ArgumentParser without prefix matching, whose errors are one line (exit 2) with a suggestion for
    an unknown flag."""

    def __init__(self, *args, **kwargs):
        kwargs.setdefault("formatter_class", argparse.RawDescriptionHelpFormatter)
        super().__init__(*args, allow_abbrev=False, **kwargs)

    def flags(self) -> list[str]:
        return [s for action in self._actions for s in action.option_strings if s.startswith("--")]

    def closest(self, flag: str) -> str | None:
        """The flag(s) meant by `flag`: those whose dotted last part it is (`--lr` → `--ppo.lr or
        --hybrid.learning.lr`), else the nearest spelling (`--total_step` → `--total-steps`); None if nothing is near."""
        name = flag.split("=", 1)[0]
        if not name.startswith("--"):
            return None
        flags = self.flags()
        by_key = [f for f in flags if "." in f and f.rsplit(".", 1)[-1] == name[2:]]
        if by_key:
            return " or ".join(by_key[:3])
        near = difflib.get_close_matches(name.replace("_", "-"), [f.replace("_", "-") for f in flags], n=1,
                                         cutoff=0.75)
        spelled = sorted(flags, key=lambda f: "_" in f)  # --total-steps before its alias --total_steps
        return next((f for f in spelled if near and f.replace("_", "-") == near[0]), None)

    def error(self, message: str):
        unknown = re.match(r"unrecognized arguments: (.*)", message)
        if unknown:
            hints = [f"{flag} (did you mean {meant}?)" if (meant := self.closest(flag)) else flag
                     for flag in unknown.group(1).split() if flag.startswith("-")]
            message = f"unknown flag{'s' if len(hints) > 1 else ''} " + ", ".join(hints or [unknown.group(1)])
            message += f"; {self.prog} --help lists them"
        print(f"{self.prog}: error: {message}", file=sys.stderr)
        raise SystemExit(2)


def print_error(error: BaseException) -> None:
    """An input error on stderr: one `error:` line for each independent error it names (agents.config.ConfigError
    collects them in one pass), else one line."""
    for line in getattr(error, "errors", None) or [error]:
        print(f"error: {line}", file=sys.stderr)


def is_data_path(item: str) -> bool:
    """A --data value that is one market's file or synthetic:PRESET, not SYMBOL=PATH (a path holding "=" that is a
    file is a path)."""
    return "=" not in item or Path(item).is_file()


def data_items(items: list[str] | None) -> tuple[str | None, list[str]]:
    """--data as given (repeatable), read once for every script: (one market's file: the last PATH given, or None;
    an account's SYMBOL=PATH items in order, or []). A bare path mixed with SYMBOL=PATH is a ConfigError, one line."""
    from agents.config import ConfigError

    items = items or []
    if all(map(is_data_path, items)):
        return (items[-1] if items else None), []
    bare = next(filter(is_data_path, items), None)
    if bare is not None:
        raise ConfigError(f"--data: {bare} is one market's file but the others are SYMBOL=PATH; give one PATH, or "
                          "SYMBOL=PATH once per instrument of one account (--data NQ=nq.csv --data ES=es.csv)")
    return None, list(items)


def data_overrides(items: list[str] | None) -> list[str]:
    """The config overrides of --data (data_items): data.source for one market's file, data.instruments for an
    account's SYMBOL=PATH items."""
    single, instruments = data_items(items)
    if single is not None:
        return [f"data.source={single}"]
    return [f"data.instruments={json.dumps(instruments)}"] if instruments else []
