"""docs/design.md's process rule: the trainer's packages (`agents`, `jaxenv`) import neither torch nor any module of
the sidecar (`llm_sidecar`), at the top of a file or inside a function; what both sides need lives in `bridge`."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
FORBIDDEN = ("torch", "transformers", "peft", "bitsandbytes", "llm_sidecar")


def imported(path: Path) -> list[tuple[int, str]]:
    """(line, top-level module) of every import statement in the file."""
    out = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out += [(node.lineno, alias.name.split(".")[0]) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            out.append((node.lineno, node.module.split(".")[0]))
    return out


@pytest.mark.nojit
@pytest.mark.parametrize("package", ["agents", "jaxenv"])
def test_the_trainers_packages_import_no_sidecar_or_torch_module(package):
    found = [f"{path.relative_to(ROOT)}:{line} imports {module}"
             for path in sorted((ROOT / package).rglob("*.py")) for line, module in imported(path)
             if module in FORBIDDEN]
    assert found == []
