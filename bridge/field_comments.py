"""A dataclass's field comments, read from its source: the help of the trainer's config flags and default.yaml
(agents.config) and of the sidecar's backend flags (llm_sidecar.__main__), so a field's meaning is written once,
beside the field."""

from __future__ import annotations

import dataclasses
import inspect
import re


def field_comments(cls: type) -> dict[str, str]:
    """{field: its comment in the source}: the comment on the field's line, else the comment lines just above it."""
    comments: dict[str, str] = {}
    block: list[str] = []
    sources = [inspect.getsourcelines(c)[0] for c in reversed(cls.__mro__) if dataclasses.is_dataclass(c)]
    for line in (line for lines in sources for line in lines):  # a subclass's comment wins
        text = line.strip()
        if text.startswith("#"):
            block.append(text.lstrip("# "))
            continue
        match = re.match(r"(\w+): [^=]+=", text)
        if match:
            trailing = text.split("  # ", 1)[1] if "  # " in text else ""
            comments[match.group(1)] = trailing or " ".join(block)
        block = []
    return comments
