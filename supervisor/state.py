"""The supervisor's published state: a small JSON file written atomically, read by the gateway's /health
(gateway/supervisor_state.py: the file is the interface, the gateway imports nothing of the supervisor).

{"unhealthy": {"<triton model>": "<reason>"}, "updated": <unix time>}"""
from __future__ import annotations

import json
import os
import time
from pathlib import Path

# names the file for Triton and its stubs (the BLS fronts read it: backends/stage_common/supervisor_view.py) and
# for the gateway's /health
STATE_FILE_VARIABLE = "SUPERVISOR_STATE_FILE"


def write_state(path: Path, unhealthy: dict[str, str]) -> None:
    path = Path(path)
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps({"unhealthy": unhealthy, "updated": time.time()}))
    os.replace(tmp, path)
