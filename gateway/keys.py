"""API keys (issue 25): the keys file, scopes, and the constant-time lookup of a presented key.

GATEWAY_API_KEYS_FILE holds one key a line: `<sha256 hex of the key> <key id> <scopes> [limit=value ...]`,
scopes comma-separated (`inference`, `admin`; `admin` includes `inference`), optional per-key limits
`rps=`, `concurrency=`, `tpm=` (0: unlimited). Blank lines and `#` comments are ignored. The file never
holds a plain key: only its SHA-256."""
from __future__ import annotations

import hashlib
import hmac
import re
import secrets
from dataclasses import dataclass, field
from pathlib import Path

SCOPES = ("inference", "admin")
IMPLIED = {"admin": ("admin", "inference"), "inference": ("inference",)}
LIMIT_FIELDS = {"rps": "requests_per_second", "concurrency": "concurrency", "tpm": "tokens_per_minute"}
KEY_ID_RE = re.compile(r"[A-Za-z0-9_.@:-]{1,64}")
HASH_RE = re.compile(r"[0-9a-f]{64}")


@dataclass(frozen=True)
class ApiKey:
    key_id: str
    digest: bytes  # sha256 of the key
    scopes: frozenset[str]
    limits: dict = field(default_factory=dict, hash=False, compare=False)  # rps / concurrency / tpm overrides

    def allows(self, scope: str) -> bool:
        return scope in self.scopes


def hash_key(key: str) -> str:
    return hashlib.sha256(key.encode("utf-8")).hexdigest()


def key_line(key: str, key_id: str, scopes: str = "admin", **limits: int) -> str:
    """A keys-file line for `key` (what the operator, `make triton` and the tests write)."""
    extra = "".join(f" {name}={value}" for name, value in limits.items())
    return f"{hash_key(key)} {key_id} {scopes}{extra}\n"


def new_key() -> str:
    return "gk-" + secrets.token_urlsafe(32)


def parse_keys(text: str, source: str = "GATEWAY_API_KEYS_FILE") -> list[ApiKey]:
    """Every key of a keys file; a malformed line is refused at start, naming its line number."""
    keys, ids = [], set()
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        parts = line.split()
        where = f"{source} line {number}"
        if len(parts) < 3:
            raise ValueError(f"{where}: expected '<sha256 hex> <key id> <scopes>', got {len(parts)} fields")
        digest, key_id, scopes_text, *extra = parts
        if not HASH_RE.fullmatch(digest.lower()):
            raise ValueError(f"{where}: the first field must be the key's sha256 in hex (64 characters), never the key")
        if not KEY_ID_RE.fullmatch(key_id):
            raise ValueError(f"{where}: key id must be 1-64 characters of [A-Za-z0-9_.@:-]")
        if key_id in ids:
            raise ValueError(f"{where}: key id {key_id!r} appears twice")
        scopes: set[str] = set()
        for scope in scopes_text.split(","):
            if scope not in IMPLIED:
                raise ValueError(f"{where}: unknown scope {scope!r} (scopes: {', '.join(SCOPES)})")
            scopes.update(IMPLIED[scope])
        limits = {}
        for item in extra:
            name, _, value = item.partition("=")
            if name not in LIMIT_FIELDS or not value.isdigit():
                raise ValueError(f"{where}: expected rps=N, concurrency=N or tpm=N, got {item!r}")
            limits[LIMIT_FIELDS[name]] = int(value)
        ids.add(key_id)
        keys.append(ApiKey(key_id, bytes.fromhex(digest.lower()), frozenset(scopes), limits))
    return keys


class KeyRing:
    """The configured keys. `find` hashes the presented key and compares it with every stored digest in
    constant time (hmac.compare_digest, no early exit), so timing tells nothing about which bytes match."""

    def __init__(self, keys: list[ApiKey]):
        self.keys = list(keys)

    @classmethod
    def from_file(cls, path: Path) -> "KeyRing":
        return cls(parse_keys(Path(path).read_text(), str(path)))

    def find(self, presented: str) -> ApiKey | None:
        digest = hashlib.sha256(presented.encode("utf-8", "surrogateescape")).digest()
        found = None
        for key in self.keys:
            if hmac.compare_digest(digest, key.digest):
                found = key
        return found
