"""The launcher's Ctrl-C handling (issue 35, item 8), each scenario in a fresh interpreter: they send SIGINT to
their own process, and pytest's process has loaded OpenVINO, torch and others by the time they run, which change
how a signal is taken (tests/launcher_signal_scenarios.py says how). The scenarios are plain pytest tests there."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

SCENARIOS = Path(__file__).with_name("launcher_signal_scenarios.py")
ROOT = SCENARIOS.parent.parent


@pytest.mark.parametrize("scenario", ["test_a_ctrl_c_during_start_up_stops_without_a_traceback",
                                      "test_a_second_ctrl_c_after_the_server_is_gone_still_lets_the_clean_up_run"])
def test_the_launchers_ctrl_c_scenario_passes_in_a_fresh_interpreter(scenario):
    run = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                          f"{SCENARIOS.relative_to(ROOT)}::{scenario}"],
                         cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0 and "1 passed" in run.stdout, run.stdout[-4000:] + run.stderr[-2000:]
