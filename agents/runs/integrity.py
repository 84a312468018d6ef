"""Checkpoint integrity: a manifest of content hashes written last into every checkpoint, checked before a restore,
and a finite check of what was restored.

    RUN_DIR/checkpoints/latest/<update>/manifest.json   {"files": {"state/_METADATA": {"bytes": n, "sha256": ...}}}

orbax renames a checkpoint into place only when complete, but nothing checks its bytes afterwards: a byte overwritten
in a data file can restore as NaN weights without an error. The manifest is written once orbax has finished (so a
checkpoint without one never finished saving), atomically (temporary file, fsync, rename). A checkpoint whose files
differ from it, or whose restored parameters are not finite, is a `CheckpointDamaged` error naming the checkpoint
and the file or array.

A run made before manifests existed has none at all; its checkpoints are restored unverified, with a note.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any

import jax
import numpy as np

from agents.runs.storage import replace_text

MANIFEST_FILE = "manifest.json"
_CHUNK = 1 << 20


class CheckpointDamaged(ValueError):
    """A checkpoint whose bytes differ from its manifest, that has no manifest, or that holds non-finite
    parameters; the message names the checkpoint and the file or array."""


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def content_hashes(step_dir: str | Path) -> dict[str, dict]:
    """{relative path: {"bytes", "sha256"}} of every file in a checkpoint folder but the manifest."""
    step_dir = Path(step_dir)
    files = sorted(p for p in step_dir.rglob("*") if p.is_file() and p.name != MANIFEST_FILE)
    return {p.relative_to(step_dir).as_posix(): {"bytes": p.stat().st_size, "sha256": _sha256(p)} for p in files}


def write_manifest(step_dir: str | Path) -> Path:
    """Hashes a finished checkpoint and writes its manifest last: temporary file, fsync, rename, fsync the folder."""
    step_dir = Path(step_dir)
    path = step_dir / MANIFEST_FILE
    replace_text(path, json.dumps({"version": 1, "files": content_hashes(step_dir)}, indent=1))
    fd = os.open(step_dir, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
    return path


def has_manifest(step_dir: str | Path) -> bool:
    return (Path(step_dir) / MANIFEST_FILE).is_file()


def verify(step_dir: str | Path, label: str | None = None) -> None:
    """Raises CheckpointDamaged if the checkpoint has no manifest or a file is missing, resized or changed."""
    step_dir = Path(step_dir)
    where = label or str(step_dir)
    path = step_dir / MANIFEST_FILE
    if not path.is_file():
        raise CheckpointDamaged(f"checkpoint {where} is damaged: it has no {MANIFEST_FILE} (its save never finished)")
    try:
        files = json.loads(path.read_bytes())["files"]
    except (ValueError, KeyError, TypeError):
        raise CheckpointDamaged(f"checkpoint {where} is damaged: {path} is not a readable manifest") from None
    for name, expected in files.items():
        file = step_dir / name
        if not file.is_file():
            raise CheckpointDamaged(f"checkpoint {where} is damaged: {file} is missing")
        size = file.stat().st_size
        if size != expected["bytes"]:
            raise CheckpointDamaged(f"checkpoint {where} is damaged: {file} has {size} bytes, "
                                    f"{expected['bytes']} when saved (truncated?)")
        if _sha256(file) != expected["sha256"]:
            raise CheckpointDamaged(f"checkpoint {where} is damaged: {file} differs from its manifest "
                                    "(sha256 mismatch; bytes overwritten?)")


def manifests_in_use(manager_dir: str | Path) -> bool:
    """Whether any checkpoint of this manager has a manifest: if none has, the run predates manifests and its
    checkpoints can only be restored unverified; if some have, one without is an unfinished save."""
    root = Path(manager_dir)
    return root.is_dir() and any(has_manifest(p) for p in root.iterdir() if p.name.isdigit())


def path_name(path: tuple) -> str:
    """A pytree key path as a/b/c (dict keys, attribute names and sequence indices alike)."""
    return "/".join(str(getattr(k, "key", getattr(k, "name", getattr(k, "idx", k)))) for k in path)


def check_finite(tree: Any, where: str) -> None:
    """Raises CheckpointDamaged naming the first floating-point array of `tree` holding NaN or inf."""
    for path, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]:
        array = np.asarray(leaf)
        if np.issubdtype(array.dtype, np.floating) and not np.isfinite(array).all():
            bad = int((~np.isfinite(array)).sum())
            raise CheckpointDamaged(f"checkpoint {where} is damaged: {path_name(path)} holds {bad} non-finite "
                                    f"value(s) of {array.size}")
