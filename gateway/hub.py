"""Downloads from the Hugging Face hub for the gateway's runtime loads (/load_sentence_transformer_model,
/load_clip_model), bounded and explained (docs/hub-downloads.md):

- HUB_DOWNLOADS says whether a load may download: `off`, `on`, or an allowlist of organisations / ids.
  Its default (`default_downloads`) is `on` when loading needs a key or the gateway listens on loopback.
- Before any byte is fetched, the repository's file list and sizes (hub metadata) are checked: the files
  a loader needs (configs, tokenizer, safetensors weights; pickled weights only with HUB_ALLOW_PICKLE=1),
  their total against HUB_MAX_DOWNLOAD_BYTES, and that it is the kind of model asked for.
- The files go to a Hugging Face cache in DATA_DIR (HUB_CACHE_DIR), pinned to the commit the metadata
  named, downloaded by a child process (`python -m gateway.hub_download`) that is killed after
  HUB_DOWNLOAD_TIMEOUT_S, with progress in the log. One download per repository however many clients
  (threads or gateway processes) ask: a lock file per repository, and a record once it is complete.
- The result is a snapshot folder with the layout of a local model folder under MODEL_ROOTS: the caller
  generates and exports it exactly like one.

huggingface_hub is imported only when the hub is asked (not at start)."""
from __future__ import annotations

import ipaddress
import json
import logging
import os
import re
import select
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath

from gateway import errors

log = logging.getLogger("gateway.hub")
ROOT = Path(__file__).resolve().parent.parent

ORG = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,95}$")
HUB_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,95}/[A-Za-z0-9][A-Za-z0-9._-]{0,95}$")
_ON, _OFF = {"on", "1", "true", "yes"}, {"off", "0", "false", "no"}
DEFAULT_MAX_BYTES = 5_000_000_000  # 5 GB
PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".ckpt", ".pkl", ".pickle")
# Configs and tokenizer files a loader reads (top level, or one module folder down: 1_Pooling/config.json)
CONFIG_SUFFIXES = (".json", ".txt", ".model")
# Folders of other runtimes' exports, never needed (the gateway exports its own ONNX graphs)
SKIP_FOLDERS = {"onnx", "openvino", "tf", "flax", "coreml", "gguf"}
PROGRESS_EVERY_S = 5.0


@dataclass(frozen=True)
class HubOptions:
    downloads: str = "off"  # "off" | "on" | "allowlist"
    allowlist: tuple[str, ...] = ()  # lower-case organisations ("intfloat") or ids ("intfloat/e5-small-v2")
    max_bytes: int = DEFAULT_MAX_BYTES
    allow_pickle: bool = False
    timeout_s: float = 1800.0  # one repository's whole download
    metadata_timeout_s: float = 30.0  # one metadata request
    cache_dir: Path = ROOT / "data" / "hub_cache"
    endpoint: str | None = None  # HF_ENDPOINT; None: huggingface_hub's default
    token: str | None = field(default=None, repr=False)  # HF_TOKEN

    @property
    def setting(self) -> str:
        """HUB_DOWNLOADS as it is in effect (for messages and the log)."""
        return ",".join(self.allowlist) if self.downloads == "allowlist" else self.downloads


# ---------------------------------------------------------------- the setting

def is_loopback(host: str) -> bool:
    host = host.strip().strip("[]").lower()
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def default_downloads(host: str, keys_configured: bool) -> str:
    """HUB_DOWNLOADS when it is not set: `on` when loading a model needs a key (`keys_configured`: the
    gateway's API keys are configured) or when the gateway listens on loopback only; otherwise `off`, so
    an exposed gateway without keys never downloads on a stranger's request."""
    return "on" if keys_configured or is_loopback(host) else "off"


def parse_downloads(value: str | None, default: str) -> tuple[str, tuple[str, ...]]:
    """HUB_DOWNLOADS -> (mode, allowlist). Anything unusable is refused at start, naming the variable."""
    value = (value or "").strip()
    if not value:
        value = default
    word = value.lower()
    if word in _ON:
        return "on", ()
    if word in _OFF:
        return "off", ()
    entries = tuple(dict.fromkeys(e.strip().lower() for e in value.split(",") if e.strip()))
    bad = [e for e in entries if not (ORG.match(e) or HUB_ID.match(e))]
    if bad or not entries:
        raise ValueError(f"HUB_DOWNLOADS must be off, on, or a comma-separated list of hub organisations or ids "
                         f"(org or org/name), not {value!r}")
    return "allowlist", entries


def check_allowed(repo_id: str, options: HubOptions) -> None:
    if options.downloads == "on":
        return
    if options.downloads == "off":
        raise errors.HubDownloadsOff(
            f"model '{repo_id}' is not in the download cache and hub downloads are off (HUB_DOWNLOADS=off): "
            "set HUB_DOWNLOADS=on, or to an allowlist that names it, or put the model in a folder under MODEL_ROOTS")
    org = repo_id.split("/", 1)[0].lower()
    if repo_id.lower() not in options.allowlist and org not in options.allowlist:
        raise errors.HubNotAllowed(
            f"model '{repo_id}' is not on the hub download allowlist (HUB_DOWNLOADS={options.setting}): "
            f"add '{org}' or '{repo_id}' to it")


# ---------------------------------------------------------------- what to fetch

@dataclass(frozen=True)
class Plan:
    repo_id: str  # as the hub spells it
    commit: str
    files: dict[str, int]  # path in the repository -> size in bytes

    @property
    def total(self) -> int:
        return sum(self.files.values())


def _gb(n: int) -> str:
    return f"{n / 1e9:.2f} GB" if n >= 1e8 else f"{n / 1e6:.1f} MB"


def select_files(repo_id: str, kind: str, sizes: dict[str, int | None], model_config: dict | None,
                 options: HubOptions) -> dict[str, int]:
    """The files a loader of `kind` needs out of the repository's listing (path -> size), checked for the
    kind of model, pickled weights and the size cap. Raises the error that says why not."""
    def usable(path: str) -> bool:
        parts = PurePosixPath(path).parts
        return len(parts) <= 2 and not (len(parts) == 2 and parts[0].lower() in SKIP_FOLDERS)

    names = {PurePosixPath(p).name for p in sizes if usable(p)}
    if kind == "sentence_transformer" and "modules.json" not in sizes:
        raise errors.NotEmbeddingModel(f"model '{repo_id}' is not a sentence-transformers model (the repository "
                                       "has no modules.json)")
    if kind == "clip":
        model_type = (model_config or {}).get("model_type")
        if "config.json" not in sizes or "preprocessor_config.json" not in sizes or model_type not in (None, "clip"):
            raise errors.NotEmbeddingModel(
                f"model '{repo_id}' is not a transformers CLIP model (needs config.json with model_type 'clip' and "
                f"preprocessor_config.json; the hub says model_type {model_type!r})")
    if "tokenizer.json" not in names:
        raise errors.NotEmbeddingModel(f"model '{repo_id}' has no tokenizer.json (a fast tokenizer), which the "
                                       "gateway's tokenizer stage needs")
    configs = {p: s for p, s in sizes.items() if usable(p) and p.endswith(CONFIG_SUFFIXES)}
    safetensors = {p: s for p, s in sizes.items() if usable(p) and p.endswith(".safetensors")}
    pickled = {p: s for p, s in sizes.items()
               if usable(p) and PurePosixPath(p).name.startswith("pytorch_model") and p.endswith(PICKLE_SUFFIXES)}
    if safetensors:
        weights = safetensors  # pickled weights beside them are never fetched
    elif pickled and options.allow_pickle:
        weights = pickled
    elif pickled:
        raise errors.HubPickleRefused(
            f"model '{repo_id}' has its weights only as pickled files ({', '.join(sorted(pickled))}); loading them "
            "can run code from the repository: set HUB_ALLOW_PICKLE=1 to allow it, or use a repository with "
            "safetensors weights")
    else:
        raise errors.NotEmbeddingModel(f"model '{repo_id}' has no weights the gateway can load "
                                       "(*.safetensors, or pytorch_model*.bin with HUB_ALLOW_PICKLE=1)")
    files = {**configs, **weights}
    unknown = sorted(p for p, s in files.items() if s is None)
    if unknown:
        raise errors.HubUnreachable(f"the hub did not give the sizes of {', '.join(unknown[:3])} of '{repo_id}'; "
                                    "the size cap cannot be checked, so nothing is downloaded")
    total = sum(files.values())
    if total > options.max_bytes:
        raise errors.HubTooLarge(
            f"model '{repo_id}' needs {_gb(total)} in {len(files)} files, over the download cap of "
            f"{_gb(options.max_bytes)} (HUB_MAX_DOWNLOAD_BYTES={options.max_bytes})")
    return files


def _explain(exc: BaseException, repo_id: str, options: HubOptions) -> errors.ApiError:
    """A huggingface_hub / requests exception as the error that says why."""
    from huggingface_hub import errors as hf_errors
    import requests

    where = options.endpoint or "https://huggingface.co"
    if isinstance(exc, hf_errors.OfflineModeIsEnabled):
        return errors.HubDownloadsOff(f"model '{repo_id}' cannot be downloaded: HF_HUB_OFFLINE=1 is set in the "
                                      "gateway's environment; unset it (HUB_DOWNLOADS decides about downloads)")
    if isinstance(exc, hf_errors.GatedRepoError):
        return _gated(repo_id, options)
    if isinstance(exc, (hf_errors.RepositoryNotFoundError, hf_errors.RevisionNotFoundError)):
        return errors.HubModelNotFound(
            f"model '{repo_id}' does not exist on the hub ({where})"
            + (", or HF_TOKEN has no access to it" if options.token else " (if it is private, set HF_TOKEN)"))
    if isinstance(exc, (requests.ConnectionError, requests.Timeout, hf_errors.LocalEntryNotFoundError)):
        return errors.HubUnreachable(f"the Hugging Face hub ({where}) cannot be reached to get '{repo_id}' "
                                     f"({type(exc).__name__}); check the network or HF_ENDPOINT")
    status = getattr(getattr(exc, "response", None), "status_code", None)
    if isinstance(exc, hf_errors.HfHubHTTPError) and status in (401, 403):
        return _gated(repo_id, options)
    if isinstance(exc, hf_errors.HfHubHTTPError):
        return errors.HubUnreachable(f"the Hugging Face hub ({where}) answered HTTP {status} for '{repo_id}'")
    return errors.internal(exc, f"hub metadata of {repo_id}")


def _gated(repo_id: str, options: HubOptions) -> errors.HubGated:
    if options.token:
        return errors.HubGated(f"model '{repo_id}' is gated or private and HF_TOKEN has no access to it: accept its "
                               "terms on the hub with the token's account")
    return errors.HubGated(f"model '{repo_id}' is gated on the hub: accept its terms there and set HF_TOKEN "
                           "in the gateway's environment")


def plan_download(repo_id: str, kind: str, options: HubOptions) -> Plan:
    """Ask the hub for the repository's files and sizes (no file content) and decide what to fetch."""
    from huggingface_hub import HfApi

    api = HfApi(endpoint=options.endpoint, token=options.token or False)
    try:
        info = api.model_info(repo_id, files_metadata=True, timeout=options.metadata_timeout_s)
    except Exception as exc:  # noqa: BLE001 - every failure becomes the error that says why
        raise _explain(exc, repo_id, options) from None
    if info.gated and not options.token:
        raise _gated(info.id or repo_id, options)
    if not info.sha:
        raise errors.HubUnreachable(f"the hub gave no commit for '{repo_id}'")
    sizes = {s.rfilename: s.size for s in info.siblings or []}
    files = select_files(info.id or repo_id, kind, sizes, info.config, options)
    return Plan(info.id or repo_id, info.sha, files)


# ---------------------------------------------------------------- the download

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
    process = subprocess.Popen([sys.executable, "-m", "gateway.hub_download"], cwd=ROOT, env=env, text=True,
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
                    f"downloading '{plan.repo_id}' ({_gb(plan.total)}) took more than {options.timeout_s:g}s "
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
                raise errors.HubTooLarge(f"the hub sent more than the {_gb(plan.total)} it announced for "
                                         f"'{plan.repo_id}'; download stopped")
            if time.monotonic() - last_report > PROGRESS_EVERY_S:
                last_report = time.monotonic()
                log.info("hub download %s: %s of %s after %.0fs", plan.repo_id, _gb(max(arrived, 0)),
                         _gb(plan.total), last_report - started)
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
        raise _child_error(plan.repo_id, result or {}, tail, options)


def _child_error(repo_id: str, result: dict, tail: str, options: HubOptions) -> errors.ApiError:
    """The child's failure (its exception's class name and HTTP status) as the error that says why."""
    from huggingface_hub import errors as hf_errors
    import requests

    name, status = result.get("error"), result.get("status")
    classes = {c.__name__: c for c in (hf_errors.GatedRepoError, hf_errors.RepositoryNotFoundError,
                                       hf_errors.RevisionNotFoundError, hf_errors.EntryNotFoundError,
                                       hf_errors.LocalEntryNotFoundError, hf_errors.OfflineModeIsEnabled,
                                       requests.ConnectionError, requests.Timeout, requests.ReadTimeout)}
    if name in classes and name != "EntryNotFoundError":
        return _explain(classes[name](result.get("message", "")), repo_id, options)
    if status in (401, 403):
        return _gated(repo_id, options)
    if isinstance(status, int) and status >= 500:
        return errors.HubUnreachable(f"the Hugging Face hub answered HTTP {status} while downloading '{repo_id}'")
    return errors.internal(RuntimeError(f"hub download of {repo_id} failed: {name}: {result.get('message')} {tail}"),
                           f"hub download of {repo_id}")


def hub_folder(repo_id: str, kind: str, options: HubOptions) -> Path:
    """The local folder of hub repository `repo_id` for a loader of `kind` ("sentence_transformer" or
    "clip"): an earlier complete download, or a new one if HUB_DOWNLOADS allows it."""
    folder = completed(repo_id, options)
    if folder is not None:
        return folder
    check_allowed(repo_id, options)
    from gateway.modelgen.onnx_cache import _Lock  # the flock the ONNX cache uses, across threads and processes

    lock_dir = options.cache_dir / ".gateway"
    lock_dir.mkdir(parents=True, exist_ok=True)
    deadline = time.monotonic() + options.timeout_s
    try:
        lock = _Lock(lock_dir / (repo_id.lower().replace("/", "--") + ".lock"), options.timeout_s + 30)
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
             _gb(plan.total), _gb(options.max_bytes), options.cache_dir)
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
    log.info("hub download %s done: %s in %.1fs -> %s", plan.repo_id, _gb(plan.total), time.monotonic() - started,
             folder)
    return folder
