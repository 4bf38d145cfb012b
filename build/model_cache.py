"""Built models kept once per machine, addressed by content: `$XDG_CACHE_HOME/triton-pipelines/<kind>/<name>/<key>/`
(`~/.cache/...` when XDG_CACHE_HOME is unset), so every clone on the machine (a second checkout, CI's fresh clone)
reuses what another one trained instead of training it again.

The key is the caller's digest of everything that determines the entry's bytes (for a trained model:
build/trained_cache.key). Each entry carries `manifest.json`: its key and the size and sha256 of each of its
files. An entry is served only when its files are exactly those of its manifest, and the manifest's key is the
one asked for; a partial, corrupt or foreign entry is rejected, moved aside and deleted, and the caller builds
it again. Writers copy into a temporary folder beside the entry and rename it into place (atomic on one file
system), so two clones writing the same entry at once leave one complete entry, never a mix of both.

Why not a library: diskcache and joblib.Memory keep values (pickles, single files) by key in their own
stores; neither keeps a folder of files, checks what it serves against a digest of its bytes, or says what
happens when two processes of two checkouts write one key. The whole job is hashlib, one rename and a
manifest.
"""
from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import tempfile
import time
from pathlib import Path

PROJECT = "triton-pipelines"  # the folder under $XDG_CACHE_HOME (pyproject.toml's project name)
MANIFEST = "manifest.json"
PARTIAL, TRASH = ".partial", ".trash"  # suffixes of a writer's temporary folder and of a rejected entry
ABANDONED_S = 3600  # a writer's temporary folder older than this is one whose writer died: deleted
_KEY = re.compile(r"^[0-9a-f]{16,128}$")


def root() -> Path:
    """$XDG_CACHE_HOME/triton-pipelines, or ~/.cache/triton-pipelines (the XDG spec ignores a relative value)."""
    base = os.environ.get("XDG_CACHE_HOME", "")
    return (Path(base) if os.path.isabs(base) else Path.home() / ".cache") / PROJECT


def entry(kind: str, name: str, key: str) -> Path:
    if not _KEY.match(key):
        raise ValueError(f"cache key {key!r}: expected a hex digest")
    return root() / kind / name / key


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 22), b""):
            h.update(block)
    return h.hexdigest()


def _files(folder: Path, exclude=()) -> list[Path]:
    return sorted(p for p in folder.rglob("*") if p.is_file() and p.name not in exclude)


def manifest_of(folder: Path, key: str, exclude=()) -> dict:
    """What an entry made from `folder` holds: every file's size and sha256, and a digest over all of them."""
    files = {str(p.relative_to(folder)): {"size": p.stat().st_size, "sha256": _sha256(p)}
             for p in _files(folder, exclude)}
    tree = hashlib.sha256(json.dumps(files, sort_keys=True).encode()).hexdigest()
    return {"key": key, "files": files, "sha256": tree}


def problem(folder: Path, key: str) -> str | None:
    """Why `folder` is not a complete, intact entry for `key` (None: it is one)."""
    try:
        manifest = json.loads((folder / MANIFEST).read_text())
    except FileNotFoundError:
        return "no manifest (a partial entry)"
    except (OSError, ValueError) as error:
        return f"unreadable manifest ({error})"
    if not isinstance(manifest, dict) or manifest.get("key") != key:
        return "its manifest names another key (a foreign entry)"
    if not isinstance(manifest.get("files"), dict):
        return "its manifest lists no files"
    try:
        found = manifest_of(folder, key, exclude=(MANIFEST,))
    except OSError as error:
        return f"unreadable ({error})"
    if found["files"].keys() != manifest["files"].keys():
        return "its files are not those of its manifest"
    for path, want in manifest["files"].items():
        if found["files"][path] != want:
            return f"{path} is not the file its manifest describes"
    if found["sha256"] != manifest.get("sha256"):
        return "its digest is not its manifest's"
    return None


def _discard(folder: Path) -> None:
    """Move `folder` aside (one rename, so no reader sees half of it deleted), then delete it."""
    aside = folder.with_name(f"{folder.name}.{os.getpid()}.{time.monotonic_ns()}{TRASH}")
    try:
        folder.rename(aside)
    except OSError:
        return  # someone else moved it first (or the cache is read-only: then it is only never served)
    shutil.rmtree(aside, ignore_errors=True)


def fetch(kind: str, name: str, key: str, dest: Path) -> bool:
    """Copy the entry's files into `dest` (an empty folder) when the cache has an intact one. The copy is
    checked, not only the entry: what was read is what the caller gets, whatever another process did to the
    entry meanwhile. A bad entry is reported and deleted, and False returned: the caller builds it again."""
    source = entry(kind, name, key)
    if not source.is_dir():
        return False
    try:
        shutil.copytree(source, dest, dirs_exist_ok=True)
    except (OSError, shutil.Error) as error:
        reason = f"unreadable ({error})"
    else:
        reason = problem(dest, key)
    if reason is not None:
        print(f"  {name}: cache entry {source} rejected: {reason}; building it again", flush=True)
        _discard(source)
        shutil.rmtree(dest, ignore_errors=True)
        dest.mkdir(parents=True)
        return False
    (dest / MANIFEST).unlink()
    return True


def has(kind: str, name: str, key: str) -> bool:
    """Whether an entry with a manifest is there (not checked byte by byte: fetch does that)."""
    return (entry(kind, name, key) / MANIFEST).is_file()


def _sweep(parent: Path) -> None:
    """Delete what dead writers left: temporary folders older than ABANDONED_S, and rejected entries."""
    now = time.time()
    for item in parent.iterdir():
        try:
            abandoned = item.name.endswith(PARTIAL) and now - item.stat().st_mtime > ABANDONED_S
        except FileNotFoundError:
            continue
        if abandoned or item.name.endswith(TRASH):
            shutil.rmtree(item, ignore_errors=True)


def store(kind: str, name: str, key: str, src: Path, exclude=()) -> Path:
    """Put the files of `src` (less the names in `exclude`) into the cache as the entry for `key`: copied into a
    temporary folder beside the entry, then renamed into place. An intact entry already there is kept (same key,
    same bytes: training is deterministic); a bad one is replaced."""
    target = entry(kind, name, key)
    target.parent.mkdir(parents=True, exist_ok=True)
    _sweep(target.parent)
    work = Path(tempfile.mkdtemp(prefix=f".{key[:16]}.", suffix=PARTIAL, dir=target.parent))
    try:
        for path in _files(src, exclude):
            copy = work / path.relative_to(src)
            copy.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(path, copy)
        manifest = manifest_of(work, key)
        (work / MANIFEST).write_text(json.dumps(manifest, indent=1, sort_keys=True) + "\n")  # last: complete now
        for _ in range(3):
            try:
                os.rename(work, target)  # fails (ENOTEMPTY/EEXIST) when another writer's entry is there
                return target
            except OSError as error:
                failure = error
                if problem(target, key) is None:
                    existing = json.loads((target / MANIFEST).read_text())
                    if existing["sha256"] != manifest["sha256"]:
                        print(f"  {name}: kept the cache entry {target}, whose bytes differ from these: the same "
                              f"key gave other bytes (is training still deterministic here?)", flush=True)
                    return target
                if target.exists():
                    _discard(target)
        raise failure  # an OSError, as every other way this can fail: the callers report it and go on
    finally:
        shutil.rmtree(work, ignore_errors=True)  # gone already once renamed
