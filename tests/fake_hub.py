"""A local stand-in for the Hugging Face hub, for tests: a threaded HTTP server on 127.0.0.1 (free port)
that answers what huggingface_hub 0.36 asks when `HF_ENDPOINT` (or `endpoint=`) points at it:

- GET /api/models/<org>/<name>[/revision/<rev>][?blobs=True]: HfApi.model_info / repo_info (id, sha,
  siblings with size and lfs when blobs=True, gated, private, config.model_type);
- HEAD and GET /<org>/<name>/resolve/<rev>/<path>: hf_hub_download (X-Repo-Commit, ETag, Content-Length,
  Accept-Ranges; GET honours `Range: bytes=N-` so a stopped download resumes);
- errors as the hub signals them: 401 + X-Error-Code RepoNotFound (missing or private without a token),
  401 + GatedRepo (gated without an accepted token), 404 + EntryNotFound, 404 + RevisionNotFound.

Repositories are folders on disk (or files given as bytes) in the real repositories' layout; every request
is counted (`requests`, `downloads(repo, file)`), and `throttle_s` slows file bodies down (timeouts).
Usage: `with FakeHub() as hub: hub.add("org/name", folder); ...hub.url...`."""
from __future__ import annotations

import hashlib
import json
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, unquote, urlparse

CHUNK = 64 * 1024


@dataclass
class FakeRepo:
    repo_id: str
    files: dict[str, bytes]
    commit: str
    gated: bool = False
    private: bool = False
    model_type: str | None = None
    extra_sizes: dict[str, int] = field(default_factory=dict)  # reported size != served size (a lying hub)

    def sha256(self, path: str) -> str:
        return hashlib.sha256(self.files[path]).hexdigest()


def folder_files(folder: Path) -> dict[str, bytes]:
    """Every file under `folder`, by its path relative to it (as the hub lists them)."""
    folder = Path(folder)
    return {p.relative_to(folder).as_posix(): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


class FakeHub:
    def __init__(self, token: str = "hf_fake_token"):
        self.repos: dict[str, FakeRepo] = {}
        self.token = token  # the token accepted for gated and private repositories
        self.requests: Counter = Counter()  # (method, kind, repo_id, path) -> count
        self.throttle_s = 0.0  # sleep per 64 KiB chunk of a file body
        self._lock = threading.Lock()
        self._server: ThreadingHTTPServer | None = None
        self._stopping = threading.Event()

    # ---- repositories -----------------------------------------------------------------------
    def add(self, repo_id: str, folder: Path | None = None, files: dict[str, bytes] | None = None,
            gated: bool = False, private: bool = False, drop: tuple[str, ...] = (),
            rename: dict[str, str] | None = None) -> FakeRepo:
        content = dict(folder_files(folder) if folder else {})
        content.update(files or {})
        for name in drop:
            content.pop(name, None)
        for old, new in (rename or {}).items():
            content[new] = content.pop(old)
        digest = hashlib.sha1(repo_id.encode())
        for name in sorted(content):
            digest.update(name.encode() + b"\0" + content[name])
        commit = digest.hexdigest()  # 40 hex digits, like a git commit
        model_type = None
        if "config.json" in content:
            try:
                model_type = json.loads(content["config.json"]).get("model_type")
            except ValueError:
                pass
        repo = FakeRepo(repo_id, content, commit, gated, private, model_type)
        self.repos[repo_id.lower()] = repo
        return repo

    def downloads(self, repo_id: str, path: str) -> int:
        """How many GETs of the file's content the hub answered."""
        return self.requests[("GET", "resolve", repo_id.lower(), path)]

    def content_requests(self) -> int:
        return sum(n for (method, kind, _, _), n in self.requests.items() if kind == "resolve")

    # ---- server ------------------------------------------------------------------------------
    @property
    def url(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}"

    def start(self) -> "FakeHub":
        hub = self

        class Handler(_Handler):
            pass

        Handler.hub = hub
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        threading.Thread(target=self._server.serve_forever, daemon=True).start()
        return self

    def stop(self) -> None:
        self._stopping.set()
        if self._server:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    def __enter__(self) -> "FakeHub":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


class _Handler(BaseHTTPRequestHandler):
    hub: FakeHub

    def log_message(self, *args) -> None:  # quiet
        pass

    def _authorized(self) -> bool:
        return self.headers.get("Authorization", "") == f"Bearer {self.hub.token}"

    def _error(self, status: int, code: str | None, message: str) -> None:
        body = json.dumps({"error": message}).encode()
        self.send_response(status)
        if code:
            self.send_header("X-Error-Code", code)
        self.send_header("X-Error-Message", message)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def _repo(self, repo_id: str) -> FakeRepo | None:
        repo = self.hub.repos.get(repo_id.lower())
        if repo is None or (repo.private and not self._authorized()):
            self._error(401, "RepoNotFound", "Repository not found")
            return None
        return repo

    def do_HEAD(self) -> None:
        self._route()

    def do_GET(self) -> None:
        self._route()

    def _route(self) -> None:
        url = urlparse(self.path)
        parts = [unquote(p) for p in url.path.split("/") if p]
        try:
            if parts[:2] == ["api", "models"] and len(parts) >= 4:
                self._count("info", "/".join(parts[2:4]), "")
                return self._info("/".join(parts[2:4]), parts[5] if len(parts) >= 6 and parts[4] == "revision"
                                  else "main", parse_qs(url.query))
            if len(parts) >= 5 and parts[2] == "resolve":
                repo_id, path = "/".join(parts[:2]), "/".join(parts[4:])
                self._count("resolve", repo_id, path)
                return self._resolve(repo_id, parts[3], path)
            self._error(404, None, "Not found")
        except (BrokenPipeError, ConnectionResetError):  # the client went away (a killed download)
            pass

    def _count(self, kind: str, repo_id: str, path: str) -> None:
        with self.hub._lock:
            self.hub.requests[(self.command, kind, repo_id.lower(), path)] += 1

    def _revision_ok(self, repo: FakeRepo, revision: str) -> bool:
        if revision in ("main", repo.commit):
            return True
        self._error(404, "RevisionNotFound", "Invalid rev id")
        return False

    def _info(self, repo_id: str, revision: str, query: dict) -> None:
        repo = self._repo(repo_id)
        if repo is None or not self._revision_ok(repo, revision):
            return
        blobs = query.get("blobs", ["false"])[0].lower() == "true"
        siblings = []
        for path, data in sorted(repo.files.items()):
            sibling = {"rfilename": path}
            if blobs:
                size = repo.extra_sizes.get(path, len(data))
                sibling.update(size=size, blobId=hashlib.sha1(data).hexdigest())
                if path.endswith((".safetensors", ".bin")):
                    sibling["lfs"] = {"sha256": repo.sha256(path), "size": size, "pointerSize": 134}
            siblings.append(sibling)
        body = {"_id": repo.commit[:24], "id": repo.repo_id, "modelId": repo.repo_id,
                "author": repo.repo_id.split("/")[0],
                "sha": repo.commit, "lastModified": "2026-01-01T00:00:00.000Z", "private": repo.private,
                "gated": "manual" if repo.gated else False, "disabled": False, "tags": [],
                "library_name": "sentence-transformers" if "modules.json" in repo.files else "transformers",
                "config": {"model_type": repo.model_type} if repo.model_type else {}, "siblings": siblings}
        data = json.dumps(body).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(data)

    def _resolve(self, repo_id: str, revision: str, path: str) -> None:
        repo = self._repo(repo_id)
        if repo is None or not self._revision_ok(repo, revision):
            return
        if repo.gated and not self._authorized():
            return self._error(401, "GatedRepo", "Access to model is restricted")
        if path not in repo.files:
            return self._error(404, "EntryNotFound", "Entry not found")
        data = repo.files[path]
        start = 0
        ranged = self.headers.get("Range", "")
        if ranged.startswith("bytes=") and self.command == "GET":
            start = int(ranged[len("bytes="):].split("-")[0] or 0)
        self.send_response(206 if start else 200)
        self.send_header("X-Repo-Commit", repo.commit)
        self.send_header("ETag", f'"{repo.sha256(path)}"')
        self.send_header("Accept-Ranges", "bytes")
        self.send_header("Content-Length", str(len(data) - start))
        if start:
            self.send_header("Content-Range", f"bytes {start}-{len(data) - 1}/{len(data)}")
        self.end_headers()
        if self.command == "HEAD":
            return
        for offset in range(start, len(data), CHUNK):
            if self.hub._stopping.is_set():
                return
            if self.hub.throttle_s:
                time.sleep(self.hub.throttle_s)
            self.wfile.write(data[offset:offset + CHUNK])
