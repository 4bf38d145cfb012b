"""ONNX graphs of the models the gateway registers, exported once per set of weights.

At registration the model is exported (`python -m gateway.modelgen.onnx_export`, in a subprocess with a
time limit: the gateway process never imports torch) and the graphs checked against torch there. They are kept in a
cache folder keyed by a hash of the model's config and weight files, the exporter's version and the
tolerance, so registering the same weights again, under any name, or restarting the gateway, exports
nothing. The cache lives beside the generated repository (DATA_DIR/onnx_cache), not in it: Triton takes
every folder of a repository for a model (in its `none` and `poll` modes, a folder without
config.pbtxt fails the server's start; in `explicit` mode it only shows in the repository index).

Layout: <cache>/<hash>/{<graphs>, export.json}, written under a temporary name and renamed into place
while holding <cache>/<hash>.lock (flock), so concurrent registrations of the same weights, in threads or
processes, export once and never see a half-written entry. A model whose export fails or differs from
torch by more than the tolerance is recorded too (export.json with "ok": false) and served on torch;
delete its folder to try again. A timeout or a killed export is not recorded (it may pass another time).
"""
from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import subprocess
import sys
import threading
import time
import uuid
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

from gateway.file_lock import FileLock

log = logging.getLogger("gateway.onnx_cache")

ROOT = Path(__file__).resolve().parent.parent.parent
# Bump when gateway/modelgen/onnx_export.py changes the graphs it writes: every cached export is made again.
EXPORTER_VERSION = "1"
FILES = {"clip": ("text.onnx", "image.onnx"), "encoder": ("model.onnx",)}
RECORD = "export.json"


@dataclass(frozen=True)
class ExportOptions:
    enabled: bool = True
    timeout_s: float = 900.0  # one export (torch import, trace, check); over it the model runs on torch
    tolerance: float = 1e-4  # max abs difference to torch on the exporter's probes
    cache_dir: Path | None = None  # None: <generated repository>/../onnx_cache


@dataclass(frozen=True)
class Export:
    """What a registration gets: the runtime to write into the config and, for onnx, the graphs to link."""
    runtime: str  # "onnx" | "torch"
    files: dict[str, Path]  # file name in the model's version folder -> cached graph
    note: str  # how the graphs were made, or why the model runs on torch


# exporter runs started by this process (tests check that a cache hit runs none)
exports_started = 0
_count_lock = threading.Lock()
_running: set[subprocess.Popen] = set()
_hashes: dict[tuple, str] = {}


def stop_exports() -> None:
    """Kill the exports in progress (the gateway is stopping: it must not wait for them). Their models,
    if still being registered, fall back to torch; nothing is recorded, so the next start exports again."""
    with _count_lock:
        running = list(_running)
    for process in running:
        process.kill()


def cache_dir_for(repository: Path, options: ExportOptions) -> Path:
    return Path(options.cache_dir) if options.cache_dir else Path(repository).parent / "onnx_cache"


def _file_hash(path: Path) -> str:
    """sha256 of a file, remembered per (path, size, mtime) for this process: a multi-GB checkpoint is
    read once per gateway run, not at every registration."""
    stat = path.stat()
    key = (str(path.resolve()), stat.st_size, stat.st_mtime_ns)
    if key not in _hashes:
        digest = hashlib.sha256()
        with open(path, "rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                digest.update(block)
        _hashes[key] = digest.hexdigest()
    return _hashes[key]


def _version(package: str) -> str:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return "-"


def content_key(kind: str, files: list[Path], tolerance: float) -> str:
    """A hash of what the export depends on: the config and weight files' contents (not their names or
    folder), the exporter's version, the tolerance, and the torch / transformers versions that trace it."""
    digest = hashlib.sha256()
    parts = [f"exporter {EXPORTER_VERSION}", f"kind {kind}", f"tolerance {tolerance!r}",
             f"torch {_version('torch')}", f"transformers {_version('transformers')}"]
    parts += sorted(f"{p.name} {_file_hash(p)}" for p in files)
    digest.update("\n".join(parts).encode())
    return digest.hexdigest()[:32]


def _read_record(entry: Path, kind: str) -> dict | None:
    """The entry's record if it is complete (a success with every graph present, or a failure)."""
    try:
        record = json.loads((entry / RECORD).read_text())
    except (OSError, ValueError):
        return None
    if record.get("ok") and not all((entry / name).is_file() for name in FILES[kind]):
        return None
    return record


def _diffs(value) -> str:
    if isinstance(value, dict):
        return ", ".join(f"{k} {v:.1e}" for k, v in value.items())
    return f"{value:.1e}" if isinstance(value, (int, float)) else str(value)


def _from_record(entry: Path, kind: str, record: dict) -> Export:
    if record.get("ok"):
        return Export("onnx", {name: entry / name for name in FILES[kind]},
                      f"onnx: exported in {record.get('seconds')} s, max abs difference to torch "
                      f"{_diffs(record.get('max_abs_diff'))} (cache {entry.name})")
    return Export("torch", {}, f"torch: ONNX export failed ({record.get('error', '?')}); delete {entry} to retry")


def _run_exporter(kind: str, source: Path, out: Path, options: ExportOptions) -> tuple[dict | None, str | None]:
    """(result, None) on success; (None, error) on a failure worth recording; raises TimeoutError or
    RuntimeError for failures that are not recorded."""
    global exports_started
    with _count_lock:
        exports_started += 1
    cmd = [sys.executable, "-m", "gateway.modelgen.onnx_export", kind, str(Path(source).resolve()),
           str(Path(out).resolve()), "--tolerance", repr(options.tolerance)]
    # cwd=ROOT: `-m gateway...` finds this repository's gateway/ package first
    process = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    with _count_lock:
        _running.add(process)
    try:
        try:
            stdout, stderr = process.communicate(timeout=options.timeout_s)
        except subprocess.TimeoutExpired:
            process.kill()
            process.communicate()
            raise TimeoutError(f"the export took more than {options.timeout_s:g}s (ONNX_EXPORT_TIMEOUT_S)") from None
    finally:
        with _count_lock:
            _running.discard(process)
    tail = " | ".join(line for line in stderr.strip().splitlines()[-3:] if line.strip())[-500:]
    if process.returncode == 2:
        return None, tail or "the exporter refused the model"
    if process.returncode != 0:  # an environment problem, or killed (memory, shutdown): not recorded
        raise RuntimeError(f"exporter exited with status {process.returncode}: {tail}")
    return json.loads(stdout.strip().splitlines()[-1]), None


def export_graphs(kind: str, source: Path, hashed: list[Path], repository: Path, options: ExportOptions) -> Export:
    """The graphs of `source` (kind "clip": a CLIPModel folder; "encoder": a transformers encoder folder)
    from the cache, exported first if missing. `hashed`: the config and weight files that define them.
    Never raises: any failure gives Export("torch", ...) with the reason, logged."""
    if not options.enabled:
        return Export("torch", {}, "torch: ONNX export is off (ONNX_EXPORT=0)")
    cache, how = cache_dir_for(repository, options), "cache hit"
    try:
        cache.mkdir(parents=True, exist_ok=True)
        key = content_key(kind, hashed, options.tolerance)
        entry = cache / key
        record = _read_record(entry, kind)  # the usual case after the first registration: no lock needed
        if record is None:
            with FileLock(cache / f"{key}.lock", options.timeout_s + 60):
                record = _read_record(entry, kind)  # another registration may have made it meanwhile
                if record is None:
                    record, how = _export_entry(kind, source, cache, key, options), "exported"
        outcome = _from_record(entry, kind, record)
    except Exception as exc:  # noqa: BLE001 - the model is still served, on torch
        outcome, how = Export("torch", {}, f"torch: ONNX export failed ({type(exc).__name__}: {exc})"), "no export"
    (log.info if outcome.runtime == "onnx" else log.warning)("%s (%s): %s", source, how, outcome.note)
    return outcome


def _export_entry(kind: str, source: Path, cache: Path, key: str, options: ExportOptions) -> dict:
    """Run the exporter into a temporary folder and rename it to <cache>/<key> (the caller holds the
    key's lock); the record written there."""
    entry = cache / key
    for stale in cache.glob(f".tmp-{key}-*"):  # left by a killed gateway
        shutil.rmtree(stale, ignore_errors=True)
    tmp = cache / f".tmp-{key}-{uuid.uuid4().hex[:8]}"
    tmp.mkdir()
    started = time.monotonic()
    try:
        log.info("exporting %s (%s) to ONNX", source, kind)
        result, error = _run_exporter(kind, source, tmp, options)
        record = {"ok": True, **result} if result is not None else {"ok": False, "error": error}
        record.update(kind=kind, source=str(Path(source).resolve()), exporter=EXPORTER_VERSION,
                      tolerance=options.tolerance, wall_seconds=round(time.monotonic() - started, 2))
        (tmp / RECORD).write_text(json.dumps(record, indent=1) + "\n")
        if entry.exists():  # incomplete (a graph deleted by hand): replaced
            shutil.rmtree(entry)
        os.replace(tmp, entry)
        return record
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
