"""Writing files so that nothing a user saved is ever replaced by a half-written one.

Every writer here writes under a temporary name in the destination folder (same file system, so the final
`os.replace` / `os.rename` is atomic), flushes to disk, then renames. A process killed at any moment leaves either the
old file or the new one, plus at worst a hidden temporary (`.name.*.tmp`, `.staging-*`) that the next write ignores.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

__all__ = [
    "fsync_dir",
    "fsync_tree",
    "save_pretrained_atomically",
    "write_bytes_atomically",
    "write_json_atomically",
    "write_text_atomically",
]


def folder_problem(path: str | os.PathLike[str]) -> str | None:
    """Why `path` cannot be (or become) a folder, or None: it, or a folder it would be made in, is a file. Checked
    before work that ends by writing there."""
    path = Path(path)
    for candidate in (path, *path.parents):
        if candidate.exists():
            if candidate.is_dir():
                return None
            return f"{candidate} exists and is not a folder" if candidate == path else f"{candidate} is a file"
    return None


def fsync_dir(path: str | os.PathLike[str]) -> None:
    """Flush a folder's entries (renames, new files) to disk, where the platform allows it."""
    with contextlib.suppress(OSError):  # not every platform / file system lets a folder be opened for fsync
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def fsync_tree(root: str | os.PathLike[str]) -> None:
    """Flush every file under `root`, and the folders, to disk."""
    root = Path(root)
    for path in sorted(root.rglob("*")):
        if path.is_file():
            with open(path, "rb") as file:
                os.fsync(file.fileno())
    for path in sorted((p for p in root.rglob("*") if p.is_dir()), reverse=True):
        fsync_dir(path)
    fsync_dir(root)


def write_bytes_atomically(path: str | os.PathLike[str], data: bytes) -> None:
    """Write `data` to `path` through a temporary file and a rename."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as file:
            file.write(data)
            file.flush()
            os.fsync(file.fileno())
        # mkstemp makes 0600 files: keep the mode of the file replaced, else give a new file's usual mode.
        os.chmod(tmp_name, path.stat().st_mode & 0o7777 if path.exists() else _FILE_MODE)
        os.replace(tmp_name, path)
        fsync_dir(path.parent)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp_name)
        raise


def write_text_atomically(path: str | os.PathLike[str], text: str) -> None:
    write_bytes_atomically(path, text.encode("utf-8"))


def write_json_atomically(path: str | os.PathLike[str], data: Any) -> None:
    """`data` as indented JSON (UTF-8, a final newline); NaN and infinity are written as null."""
    write_text_atomically(path, json.dumps(_finite(data), indent=2, ensure_ascii=False, allow_nan=False) + "\n")


def _finite(data: Any) -> Any:
    if isinstance(data, float) and (data != data or data in (float("inf"), float("-inf"))):
        return None
    if isinstance(data, dict):
        return {key: _finite(value) for key, value in data.items()}
    if isinstance(data, (list, tuple)):
        return [_finite(value) for value in data]
    return data


def _read_umask() -> int:
    """The process's umask, read without changing it where Linux tells it (`os.umask` sets it while reading, which
    would race with threads creating files)."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    except (OSError, ValueError):
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


_FILE_MODE = 0o666 & ~_read_umask()  # what open() would give a new file


def save_pretrained_atomically(obj: Any, out: str | os.PathLike[str]) -> list[Path]:
    """`obj.save_pretrained` (a model, tokenizer or config) into `out`, each file moved into place by a rename.

    The files are written into a staging folder inside `out`, flushed, then renamed one by one over any file of the
    same name: a reader sees each file either old or new, never partial. Returns the paths written.
    """
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(dir=out, prefix=".staging-"))
    try:
        obj.save_pretrained(staging)
        fsync_tree(staging)
        folders = sorted(path.name for path in staging.iterdir() if path.is_dir())
        if folders:  # only whole files are moved into place; nothing is silently left out
            raise ValueError(f"save_pretrained wrote folders {folders}: save_pretrained_atomically moves files only.")
        names = sorted(path.name for path in staging.iterdir() if path.is_file())
        for name in names:
            os.chmod(staging / name, _FILE_MODE)  # transformers writes model.safetensors as 0600
            os.replace(staging / name, out / name)
        fsync_dir(out)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return [out / name for name in names]
