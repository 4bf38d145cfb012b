"""What the generator runs with, for the gateway's /health: precision and threads as resolved on this CPU (the config
says auto and 0; the engine's settings() say bf16 and 2), in a small JSON file beside the supervisor's state file.

`make triton` names that file in SUPERVISOR_STATE_FILE for the server and its stubs, and the gateway reads it for
/health (gateway/supervisor_state.py): the folder is already the interface between the processes, so the generator
writes `<state file's stem>.<model>.settings.json` there, atomically, at load. No state file named (a test's server,
a bare tritonserver): nothing is written; the start-up log line says the same (openvino_engine.py). Triton-free."""
from __future__ import annotations

import json
import logging
import os
import time
from pathlib import Path

STATE_VARIABLE = "SUPERVISOR_STATE_FILE"  # supervisor/state.py's; read here as stage_common/supervisor_view.py does
SUFFIX = ".settings.json"
_log = logging.getLogger("stage")


def settings_path(state_file: Path, model: str) -> Path:
    """The file beside `state_file` that says what `model` runs with (gateway/supervisor_state.py globs for it)."""
    return Path(state_file).with_name(f"{Path(state_file).stem}.{model}{SUFFIX}")


def engine_settings(engine) -> dict:
    """The engine's own account (OpenVINO: engine, precision, threads, weights, ...), its name at least."""
    settings = engine.settings() if hasattr(engine, "settings") else {}
    return {"engine": engine.name, **settings}


def publish(model: str, settings: dict, state_file: str | os.PathLike | None = None) -> Path | None:
    """Writes {"settings": ..., "updated": <unix time>} for `model`; the path, or None where no state file is named
    or the folder cannot be written (logged: /health then says nothing of the engine, the generator still serves)."""
    state_file = state_file if state_file is not None else os.environ.get(STATE_VARIABLE)
    if not state_file:
        return None
    path = settings_path(Path(state_file), model)
    tmp = path.with_name(path.name + f".{os.getpid()}.tmp")  # instances of one model may write at once
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp.write_text(json.dumps({"settings": settings, "updated": time.time()}))
        os.replace(tmp, path)
    except OSError as exc:
        _log.warning("%s: could not publish its settings to %s: %s", model, path, exc)
        return None
    return path
