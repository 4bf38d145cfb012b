"""The progress of a training of `make model` (build/build_models.py installs it in each training process).

On a terminal, one live line per training (tqdm; each training of a build on a line of its own,
BUILD_JOB_SLOT); elsewhere (a log file, CI) a plain line about every tenth of the steps and the last, with the
running loss. Under `make triton`'s background build (BUILD_STATE_DIR) it also writes the step to the build's
state folder about once a second, which the gateway turns into the progress and the time left in the 503s of
the pipeline's routes (gateway/build_state.py). BUILD_HOLD_FILE: while that file exists the training waits
before its next step (tests/test_first_answer_server.py holds a build at a known point).

Why it replaces build.common.TrainLog at run time instead of being written there: build/common.py and the
trainers are part of every trained model's key (build/common.training_stamp, build/trained_cache.py), so an
edit there trains every demo model again on every machine, for the same bytes. How progress is shown does
not change a single weight."""
from __future__ import annotations

import os
import sys
import time
from pathlib import Path

from build import common


class LiveTrainLog(common.TrainLog):
    def __init__(self, name: str, total: int):
        super().__init__(name, total)
        self.job = os.environ.get("BUILD_JOB", name)
        self.state_dir = os.environ.get("BUILD_STATE_DIR")
        self.hold = os.environ.get("BUILD_HOLD_FILE")
        self.started_at, self.written_at = time.time(), 0.0
        self.bar = None
        if sys.stdout.isatty() and not os.environ.get("CI"):
            from tqdm import tqdm

            self.bar = tqdm(total=total, desc=f"  {name}", unit="step", leave=True, dynamic_ncols=True,
                            mininterval=0.5, position=int(os.environ.get("BUILD_JOB_SLOT", 0)))
        self._publish(0)

    def _publish(self, done: int) -> None:
        if self.state_dir:
            from gateway.build_state import write_job

            write_job(Path(self.state_dir), self.job, done, self.total, self.started_at)
            self.written_at = time.monotonic()

    def step(self, step: int, loss: float) -> None:
        while self.hold and os.path.exists(self.hold):
            time.sleep(0.2)
        last = step + 1 == self.total
        if last or time.monotonic() - self.written_at >= 1.0:
            self._publish(step + 1)
        if self.bar is None:
            super().step(step, loss)  # the plain lines
            return
        self.losses.append(loss)
        self.bar.update(1)
        if (step + 1) % self.every == 0 or last:
            recent = self.losses[-self.every:]
            self.bar.set_postfix(loss=f"{sum(recent) / len(recent):.3f}", refresh=False)
        if last:
            self.bar.close()


def install() -> None:
    """Before the trainer is imported (it takes TrainLog from build.common by name)."""
    common.TrainLog = LiveTrainLog
