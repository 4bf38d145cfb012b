"""The child process of a hub download (gateway/hub/download.py starts it and kills it at its deadline): reads
{"repo_id", "revision", "files", "cache_dir", "endpoint"} as JSON on stdin, fetches each file with
huggingface_hub.hf_hub_download into the cache (resuming what an earlier, stopped download left), and
prints one JSON line per file done, then {"complete": <files>} or {"error": <exception class>, "status": <HTTP
status>, "message": ...}. The token comes from HF_TOKEN in its environment, never from its arguments."""
from __future__ import annotations

import json
import os
import sys


def main() -> int:
    job = json.loads(sys.stdin.read())
    from huggingface_hub import hf_hub_download

    token = os.environ.get("HF_TOKEN") or False  # False: no token at all, not a stored one
    try:
        for done, name in enumerate(job["files"], 1):
            hf_hub_download(job["repo_id"], name, revision=job["revision"], cache_dir=job["cache_dir"],
                                   endpoint=job.get("endpoint"), token=token)
            print(json.dumps({"file": name, "done": done}), flush=True)
    except Exception as exc:  # noqa: BLE001 - reported to the parent, which explains it
        status = getattr(getattr(exc, "response", None), "status_code", None)
        print(json.dumps({"error": type(exc).__name__, "status": status, "message": str(exc)[:500]}), flush=True)
        return 3
    print(json.dumps({"complete": len(job["files"])}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
