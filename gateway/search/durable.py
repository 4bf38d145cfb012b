"""Durable files: write to a temporary name, fsync, rename, fsync the folder. A manifest lists each
file's sha256 so that a torn or altered file is reported by name instead of being read as data.
Append-only logs: length- and crc32-framed records, fsync'd per append, so that an acknowledged write
costs its own bytes rather than a rewrite of everything before it."""
from __future__ import annotations

import hashlib
import json
import logging
import os
import struct
import zlib
from pathlib import Path

log = logging.getLogger("gateway.search")


class CorruptFile(RuntimeError):
    """A persisted file is missing or does not match its recorded checksum."""

    def __init__(self, path: Path, why: str):
        super().__init__(f"{path}: {why}")
        self.path = path


def fsync_dir(folder: Path) -> None:
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
    fsync_dir(path.parent)
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


# One log record: magic, body length, crc32 of the body, crc32 of the header's first 16 bytes, then the
# body. The checksums let a reader tell a complete record from the torn tail of an append that a crash
# cut short; the header's own checksum keeps a damaged length from passing a good record off as a tail.
RECORD_HEADER = struct.Struct("<4sQII")
RECORD_MAGIC = b"WAL1"


def _record_header(body: bytes) -> bytes:
    fields = struct.pack("<4sQI", RECORD_MAGIC, len(body), zlib.crc32(body))
    return fields + struct.pack("<I", zlib.crc32(fields))


def create_empty(path: Path) -> None:
    """A new empty file, durable (its directory entry included) before anything refers to it."""
    with open(path, "wb") as f:
        os.fsync(f.fileno())
    fsync_dir(path.parent)


def _zeros_from(data: bytes, offset: int) -> bool:
    """Nothing but zero bytes from `offset` to the end (true at the end itself)."""
    return data.count(0, offset) == len(data) - offset


class AppendLog:
    """Append-only records, each fsync'd before `append` returns. Opening reads the complete records;
    an incomplete or mismatching last record (an append a crash interrupted, so never acknowledged) is
    cut off; a bad record with more data after it is corruption of acknowledged writes: CorruptFile."""

    def __init__(self, path: Path):
        self.path = path
        self._fd: int | None = None

    def read(self) -> list[bytes]:
        """The complete records, the torn tail (if any) truncated away so appends follow the last good one."""
        try:
            data = self.path.read_bytes()
        except FileNotFoundError:
            raise CorruptFile(self.path, "missing") from None
        bodies, offset = [], 0
        while offset < len(data):
            body = self._record_at(data, offset)
            if body is None:
                log.warning("%s: dropping an incomplete last record at byte %d (%d bytes)",
                            self.path, offset, len(data) - offset)
                with open(self.path, "r+b") as f:
                    f.truncate(offset)
                    os.fsync(f.fileno())
                break
            bodies.append(body)
            offset += RECORD_HEADER.size + len(body)
        return bodies

    def _record_at(self, data: bytes, offset: int) -> bytes | None:
        """The body at `offset`; None for a torn tail (the record reaches the end of the file, or only
        zero bytes follow: some filesystems extend a file with zeros when a crash cuts an append short)."""
        if len(data) - offset < RECORD_HEADER.size:
            return None
        magic, length, crc, header_crc = RECORD_HEADER.unpack_from(data, offset)
        start, end = offset + RECORD_HEADER.size, offset + RECORD_HEADER.size + length
        if magic != RECORD_MAGIC or zlib.crc32(data[offset:start - 4]) != header_crc:
            if _zeros_from(data, offset):
                return None
            raise CorruptFile(self.path, f"no valid record header at byte {offset}")
        if end > len(data):
            return None
        body = data[start:end]
        if zlib.crc32(body) != crc:
            if _zeros_from(data, end):  # the body's end, or the last append's, came out as zeros
                return None
            raise CorruptFile(self.path, f"record at byte {offset} fails its checksum")
        return body

    def append(self, body: bytes) -> None:
        if self._fd is None:
            self._fd = os.open(self.path, os.O_WRONLY | os.O_APPEND)
        before = os.lseek(self._fd, 0, os.SEEK_END)
        try:
            for part in (_record_header(body), body):
                view = memoryview(part)
                while view:
                    view = view[os.write(self._fd, view):]
            os.fsync(self._fd)
        except BaseException:
            # a partial record followed by later appends would read as corruption: cut it off now
            os.ftruncate(self._fd, before)
            raise

    def size(self) -> int:
        return self.path.stat().st_size

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
