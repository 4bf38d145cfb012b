"""What /health reads of the supervisor's published state: the models it reports unhealthy.

The supervisor runs beside Triton and writes a small JSON file (supervisor/state.py:
{"unhealthy": {"<triton model>": "<reason>"}, "updated": <unix time>}); the file is the interface between the two
processes, so the gateway reads it here and imports nothing of the supervisor (pyproject.toml's contracts).

Beside it, the codegen generator says what it runs with (backends/gptj_generator/published_settings.py:
`<state file's stem>.<model>.settings.json`, {"settings": {"engine": ..., "precision": ..., "threads": ...}}): the
precision and threads as resolved on its CPU, for /health's `engines`."""
from __future__ import annotations

import json
from pathlib import Path


def unhealthy_models(path: Path) -> dict[str, str]:
    """Models the supervisor currently reports unhealthy (none if it has written nothing yet)."""
    try:
        return dict(json.loads(Path(path).read_text()).get("unhealthy", {}))
    except (OSError, ValueError):
        return {}


def published_settings(path: Path) -> dict[str, dict]:
    """{model: its settings} of the models that published them beside the state file `path` (none if none did)."""
    path, found = Path(path), {}
    suffix = ".settings.json"
    for item in sorted(path.parent.glob(f"{path.stem}.*{suffix}")):
        try:
            found[item.name[len(path.stem) + 1:-len(suffix)]] = dict(json.loads(item.read_text())["settings"])
        except (OSError, ValueError, KeyError, TypeError):
            continue
    return found
