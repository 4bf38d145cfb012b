"""Durable files: write to a temporary name, fsync, rename, fsync the folder. A manifest lists each
file's sha256 so that a torn or altered file is reported by name instead of being read as data."""
from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path


class CorruptFile(RuntimeError):
    """A persisted file is missing or does not match its recorded checksum."""

    def __init__(self, path: Path, why: str):
        super().__init__(f"{path}: {why}")
        self.path = path


def _fsync_dir(folder: Path) -> None:
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_bytes(path: Path, data: bytes) -> str:
    """Atomically replace `path` with `data`; returns its sha256."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    _fsync_dir(path.parent)
    return hashlib.sha256(data).hexdigest()


def write_json(path: Path, value) -> str:
    return write_bytes(path, json.dumps(value, sort_keys=True).encode())


def read_checked(path: Path, sha256: str) -> bytes:
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        raise CorruptFile(path, "missing") from None
    if hashlib.sha256(data).hexdigest() != sha256:
        raise CorruptFile(path, "checksum mismatch (torn or altered write)")
    return data


def read_json(path: Path):
    try:
        return json.loads(path.read_bytes())
    except FileNotFoundError:
        raise CorruptFile(path, "missing") from None
    except ValueError:
        raise CorruptFile(path, "not valid JSON (torn or altered write)") from None
