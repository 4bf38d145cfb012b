"""The download of a planned hub repository (gateway/hub/plan.py) into a Hugging Face cache in DATA_DIR
(HUB_CACHE_DIR), pinned to the commit the metadata named, by a child process (`python -m
gateway.hub.child`) that is killed after HUB_DOWNLOAD_TIMEOUT_S or when more bytes arrive than the hub
announced, with progress in the log. One download per repository however many clients (threads or gateway
processes) ask: a lock file per repository, and a record once it is complete. The result is a snapshot
folder with the layout of a local model folder under MODEL_ROOTS.

huggingface_hub is imported only when the hub is asked (not at start)."""
from __future__ import annotations

import json
import logging
import os
import select
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from gateway import errors
from gateway.file_lock import FileLock
from gateway.hub.explain import child_error
from gateway.hub.options import ROOT, HubOptions, check_allowed
from gateway.hub.plan import Plan, plan_download, size_text

log = logging.getLogger("gateway.hub")
PROGRESS_EVERY_S = 5.0


def _record_path(repo_id: str, options: HubOptions) -> Path:
    return options.cache_dir / ".gateway" / (repo_id.lower().replace("/", "--") + ".json")


def completed(repo_id: str, options: HubOptions) -> Path | None:
    """The snapshot folder of an earlier complete download of `repo_id`, if every file is still there."""
    try:
        record = json.loads(_record_path(repo_id, options).read_text())
        folder = options.cache_dir / record["folder"]
        if all((folder / name).is_file() for name in record["files"]):
            return folder
    except (OSError, ValueError, KeyError, TypeError):
        pass
    return None


_running: set[subprocess.Popen] = set()  # download children, killed when the gateway stops


def stop_downloads() -> None:
    """Kill the downloads in progress (the gateway is stopping: a download thread must not keep the
    process alive until it ends). Nothing is recorded as complete; the next load resumes them."""
    for process in list(_running):
        process.kill()


def _bytes_on_disk(storage: Path) -> int:
    try:
        return sum(p.stat().st_size for p in (storage / "blobs").iterdir() if p.is_file())
    except OSError:
        return 0


def snapshot_folder(plan: Plan, options: HubOptions) -> Path:
    """Where huggingface_hub's cache puts the files of `plan` (its layout: models--org--name/...)."""
    return options.cache_dir / ("models--" + plan.repo_id.replace("/", "--")) / "snapshots" / plan.commit


def _run_child(plan: Plan, options: HubOptions, deadline: float) -> None:
    """Fetch plan.files at plan.commit in a child process, killed at `deadline` or when more bytes arrive
    than the hub announced; progress in the log."""
    storage = snapshot_folder(plan, options).parent.parent
    env = dict(os.environ, HF_HUB_DISABLE_PROGRESS_BARS="1", HF_HUB_DISABLE_TELEMETRY="1", PYTHONPATH=str(ROOT))
    env.pop("HF_HUB_OFFLINE", None)
    if options.token:
        env["HF_TOKEN"] = options.token
    else:
        env.pop("HF_TOKEN", None)
    job = {"repo_id": plan.repo_id, "revision": plan.commit, "files": sorted(plan.files),
           "cache_dir": str(options.cache_dir), "endpoint": options.endpoint}
    stderr = tempfile.TemporaryFile("w+")  # not a pipe: a chatty child must never block on it
    process = subprocess.Popen([sys.executable, "-m", "gateway.hub.child"], cwd=ROOT, env=env, text=True,
                               stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=stderr)
    _running.add(process)
    started, last_report, result = time.monotonic(), 0.0, None
    base = _bytes_on_disk(storage)  # blobs of other commits already there
    try:
        process.stdin.write(json.dumps(job))
        process.stdin.close()
        while True:
            now = time.monotonic()
            if now > deadline:
                raise errors.HubDownloadTimeout(
                    f"downloading '{plan.repo_id}' ({size_text(plan.total)}) took more than {options.timeout_s:g}s "
                    "(HUB_DOWNLOAD_TIMEOUT_S); it was stopped, a later load resumes it")
            ready, _, _ = select.select([process.stdout], [], [], min(1.0, max(deadline - now, 0.01)))
            if ready:
                line = process.stdout.readline()
                if not line:  # the child closed stdout: it is done
                    break
                message = json.loads(line)
                if "file" in message:
                    log.info("hub download %s: %d/%d files (%s)", plan.repo_id, message["done"], len(plan.files),
                             message["file"])
                result = message if ("complete" in message or "error" in message) else result
            arrived = _bytes_on_disk(storage) - base
            if arrived > plan.total + (1 << 20):
                raise errors.HubTooLarge(f"the hub sent more than the {size_text(plan.total)} it announced for "
                                         f"'{plan.repo_id}'; download stopped")
            if time.monotonic() - last_report > PROGRESS_EVERY_S:
                last_report = time.monotonic()
                log.info("hub download %s: %s of %s after %.0fs", plan.repo_id, size_text(max(arrived, 0)),
                         size_text(plan.total), last_report - started)
        process.wait(timeout=max(deadline - time.monotonic(), 1))
    except BaseException:
        process.kill()
        process.wait()
        stderr.close()
        raise
    finally:
        _running.discard(process)
    stderr.seek(0)
    tail = " | ".join(stderr.read().strip().splitlines()[-3:])[-500:]
    stderr.close()
    if result is None or "error" in result or process.returncode != 0:
        raise child_error(plan.repo_id, result or {}, tail, options)


def hub_folder(repo_id: str, kind: str, options: HubOptions) -> Path:
    """The local folder of hub repository `repo_id` for a loader of `kind` ("sentence_transformer" or
    "clip"): an earlier complete download, or a new one if HUB_DOWNLOADS allows it."""
    folder = completed(repo_id, options)
    if folder is not None:
        return folder
    check_allowed(repo_id, options)
    lock_dir = options.cache_dir / ".gateway"
    lock_dir.mkdir(parents=True, exist_ok=True)
    deadline = time.monotonic() + options.timeout_s
    try:
        lock = FileLock(lock_dir / (repo_id.lower().replace("/", "--") + ".lock"), options.timeout_s + 30)
        with lock:
            folder = completed(repo_id, options)  # another client's download may have finished meanwhile
            if folder is not None:
                return folder
            return _download(repo_id, kind, options, deadline)
    except TimeoutError:
        raise errors.HubDownloadTimeout(f"'{repo_id}' is still being downloaded for another request after "
                                        f"{options.timeout_s:g}s (HUB_DOWNLOAD_TIMEOUT_S)") from None


def _download(repo_id: str, kind: str, options: HubOptions, deadline: float) -> Path:
    plan = plan_download(repo_id, kind, options)
    log.info("hub download %s at %s: %d files, %s (cap %s) into %s", plan.repo_id, plan.commit[:12], len(plan.files),
             size_text(plan.total), size_text(options.max_bytes), options.cache_dir)
    started = time.monotonic()
    _run_child(plan, options, deadline)
    folder = snapshot_folder(plan, options)
    missing = [name for name in plan.files if not (folder / name).is_file()]
    if missing:
        raise errors.internal(RuntimeError(f"{plan.repo_id}: {missing} missing after the download"), "hub download")
    record = _record_path(repo_id, options)
    tmp = record.with_suffix(f".tmp{os.getpid()}")
    tmp.write_text(json.dumps({"repo_id": plan.repo_id, "commit": plan.commit, "folder": str(
        folder.relative_to(options.cache_dir)), "files": sorted(plan.files), "bytes": plan.total}, indent=1))
    os.replace(tmp, record)
    log.info("hub download %s done: %s in %.1fs -> %s", plan.repo_id, size_text(plan.total), time.monotonic() - started,
             folder)
    return folder
