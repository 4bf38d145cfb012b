"""The keeper's lines state an outage whole (launcher/keeper.py): from the death that began it to serving again,
with the restarts it took, even when the first restart dies while starting; and a start that dies names the
error line of its log."""
from __future__ import annotations

import re
import subprocess
import sys
import time

from launcher.keeper import RUNNING, Keeper, RestartPolicy, last_error_line
from launcher.server_keeper import ServerKeeper
from launcher.service import Service

SLEEP = "import time; time.sleep(60)"


class Logged(Service):
    """Each launch runs the next script with its log as the script's output; it answers once `up_from`-th."""

    name = "logged"
    poll_s = 0.02

    def __init__(self, scripts: list[str], log_file, up_from: int = 1):
        self.scripts, self.log_file, self.up_from = list(scripts), log_file, up_from
        self.launches, self.process = 0, None

    def launch(self):
        self.launches += 1
        with open(self.log_file, "a") as out:
            self.process = subprocess.Popen([sys.executable, "-c", self.scripts.pop(0)], stdout=out, stderr=out)

    def is_up(self) -> bool:
        return self.launches >= self.up_from and self.process is not None and self.process.poll() is None

    def stop(self, timeout=None):
        if self.process is not None:
            if self.process.poll() is None:
                self.process.kill()
            self.process.wait()
        self.process = None


def test_an_outage_that_took_two_restarts_is_stated_from_the_first_death(tmp_path):
    log = tmp_path / "service.log"
    failing_start = "print('error: creating server: port 8001 already in use', flush=True); raise SystemExit(1)"
    service = Logged([SLEEP, failing_start, SLEEP], log, up_from=1)
    lines = []
    keeper = Keeper(service, RestartPolicy(backoff_s=0.2), say=lines.append, name="server", prefix="test")
    try:
        keeper.start(timeout=10)
        service.up_from = 3  # the first restart dies while starting, the second serves
        died = time.time()
        service.process.kill()
        deadline = time.monotonic() + 30
        while not (keeper.state == RUNNING and service.launches == 3):
            assert time.monotonic() < deadline, lines
            keeper.step()
            time.sleep(0.02)
    finally:
        keeper.stop()
    first, second = keeper.restarts
    assert second.cause == "died while starting: exit code 1: error: creating server: port 8001 already in use"
    assert second.down_since == first.died_at and second.tries == 2
    assert second.outage_s >= second.up_at - first.died_at - 1e-6 and second.outage_s > second.start_s
    assert first.died_at >= died - 1
    serving = lines[-1]
    assert re.fullmatch(r"test: server serving again \(pid \d+\): down from [\d:.]+ to [\d:.]+, "
                        rf"{second.outage_s:.1f}s, 2 restarts tried; this start took [\d.]+s", serving), serving


def test_the_servers_harmless_start_up_lines_never_explain_a_death(tmp_path):
    log = tmp_path / "tritonserver.log"
    log.write_text('E1202 00:00:00.1 1 server.cc:241] "CudaDriverHelper has not been initialized."\n'
                   "E1202 00:00:09.1 1 model_lifecycle.cc:641] \"failed to load 'ner' version 1: Internal: boom\"\n"
                   "error: creating server: Internal - failed to load all models\n"
                   'W1202 00:00:09.2 1 pinned_memory_manager.cc:170] "failed to allocate pinned system memory"\n')
    assert last_error_line(log, harmless=ServerKeeper.harmless_lines) == \
        "error: creating server: Internal - failed to load all models"
    log.write_text('E1202 00:00:00.1 1 server.cc:241] "CudaDriverHelper has not been initialized."\n')
    assert last_error_line(log, harmless=ServerKeeper.harmless_lines) == ""
