"""`make model`: build every pipeline's artifacts into model_repository/<model>/1/.

MODEL_PROFILE=demo (default) works offline; MODEL_PROFILE=hub fetches the real weights.

Each pipeline is built as soon as the demo models it trains are trained (two trainings at a time, each in a
process of its own), and is its own failure: a training or an export that fails (or a training process that
is killed) marks that pipeline failed and the others go on; the exit status is 1 if any failed. Each built
pipeline gets a stamp (build/built_stamp.py) that `make triton` reads to serve it at once. `--state-dir`
(BUILD_STATE_DIR): how far each pipeline is, for `make triton`'s background build (gateway/build_state.py).
"""
from __future__ import annotations

import argparse
import importlib
import os
import sys
import threading
import time
import traceback
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from build import built_stamp, common, instruction_set, train_progress, trained_cache
from build.common import MODEL_REPOSITORY, PROFILES, RETRAIN_ENV, trained, use_repository

from build.built_stamp import PIPELINES  # noqa: E402 - one list, which the launcher reads too
# The demo models each pipeline trains (build/train_*.py), longest first.
TRAINED_BY = {"ner": ["train_ner"], "codegen": ["train_codegen"], "embedding_demo": ["train_clip"],
              "food_captioning": ["train_blip", "train_food"]}
TRAIN_WORKERS = 2  # one torch thread each: byte-identical results, both cores busy


def _train_one(module_name: str, retrain: bool | None = None, slot: int = 0) -> None:
    """In a spawned process: train one demo model (and publish it to the machine's cache). `retrain`: train
    even if the stamp matches (None: as DEMO_RETRAIN says)."""
    os.environ["BUILD_JOB"], os.environ["BUILD_JOB_SLOT"] = module_name, str(slot)
    use_trained_dir()
    train_progress.install()
    if retrain is not None:
        if retrain:
            os.environ[RETRAIN_ENV] = "1"
        else:
            os.environ.pop(RETRAIN_ENV, None)
    module = importlib.import_module(f"build.{module_name}")
    trained(module.NAME, module.train, module.SOURCES)
    trained_cache.publish(module_name)  # for the other clones of this machine


def use_trained_dir() -> None:
    """DEMO_TRAINED_DIR: the trained models in another folder than .artifacts/trained/ (a test's fresh clone,
    tests/test_first_answer_server.py); read here, not in build/common.py, which is part of every model's key."""
    if os.environ.get("DEMO_TRAINED_DIR"):
        common.TRAINED_DIR = Path(os.environ["DEMO_TRAINED_DIR"])


class StateWriter:
    """The pipelines' states in BUILD_STATE_DIR, when there is one (gateway/build_state.py); else nothing."""

    def __init__(self, folder: Path | None):
        self.folder = folder

    def __call__(self, pipeline: str, **fields) -> None:
        if self.folder is not None:
            from gateway.build_state import write_pipeline

            write_pipeline(self.folder, pipeline, **fields)


def _stale_trainings(pipelines: list[str]) -> list[str]:
    random_codegen = os.environ.get("CODEGEN_DEMO_SIZE", "small") != "small"  # the 350m shape stays random
    modules = [m for p in pipelines for m in TRAINED_BY.get(p, []) if not (random_codegen and m == "train_codegen")]
    return [m for m in modules if not trained_cache.restore(m)]


def _build_pipeline(pipeline: str, profile: str) -> None:
    importlib.import_module(f"build.{pipeline}").build(profile)
    built_stamp.write(pipeline, profile, common._output["repository"])


def build_all(pipelines: list[str], profile: str, state: StateWriter, trainer=_train_one, builder=_build_pipeline,
              stale: list[str] | None = None) -> dict[str, str]:
    """Builds `pipelines`, each as soon as its trainings are done; returns {pipeline: error} of those that failed.
    `trainer(module, retrain, slot)` runs in a spawned process per training; `builder(pipeline, profile)` here."""
    from multiprocessing import get_context

    if stale is None:
        stale = _stale_trainings(pipelines) if profile == "demo" else []
    retrain = bool(os.environ.pop(RETRAIN_ENV, None))  # the builders below reuse what is trained now
    jobs = {p: [m for m in TRAINED_BY.get(p, []) if m in stale] for p in pipelines}
    for pipeline in pipelines:
        state(pipeline, state="building", phase="waiting for training" if jobs[pipeline] else "exporting",
              jobs=jobs[pipeline])
    failures: dict[str, str] = {}
    done: dict[str, str | None] = {}  # training module -> None (trained) or its error
    changed = threading.Condition()
    slots = list(range(TRAIN_WORKERS))

    def train(module_name: str) -> None:
        with changed:
            slot = slots.pop(0)
        try:
            owner = next(p for p in pipelines if module_name in jobs[p])
            state(owner, phase="training")
            process = get_context("spawn").Process(target=trainer, args=(module_name, retrain, slot),
                                                   name=f"train-{module_name}")
            process.start()
            process.join()
            error = None if process.exitcode == 0 else (
                f"training {module_name} ended with exit code {process.exitcode}" if process.exitcode > 0
                else f"training {module_name} was killed by signal {-process.exitcode}")
        except Exception as exc:  # noqa: BLE001 - recorded: the main thread waits for every training's end
            error = f"training {module_name} did not start: {exc}"
        with changed:
            slots.append(slot)
            done[module_name] = error
            changed.notify_all()

    if stale:
        print(f"make model: training {', '.join(stale)} ({TRAIN_WORKERS} at a time, one thread each)", flush=True)
    pending = list(pipelines)
    with ThreadPoolExecutor(TRAIN_WORKERS, thread_name_prefix="train") as pool:
        for module_name in stale:
            pool.submit(train, module_name)
        while pending:
            with changed:  # the next pipeline whose trainings are all done (in PIPELINES order)
                while not (ready := [p for p in pending if all(m in done for m in jobs[p])]):
                    changed.wait()
            pipeline = ready[0]
            pending.remove(pipeline)
            errors = [done[m] for m in jobs[pipeline] if done[m]]
            if errors:
                failures[pipeline] = "; ".join(errors)
            else:
                for module_name in jobs[pipeline]:
                    print(f"make model: {module_name} trained", flush=True)
                state(pipeline, phase="exporting")
                try:
                    builder(pipeline, profile)
                except BaseException as exc:  # noqa: BLE001 - that pipeline's failure alone
                    if isinstance(exc, KeyboardInterrupt):
                        raise
                    traceback.print_exc()
                    failures[pipeline] = f"{type(exc).__name__}: {exc}"[:500]
            if pipeline in failures:
                print(f"make model: {pipeline} FAILED: {failures[pipeline]}", flush=True)
                state(pipeline, state="failed", phase="", error=failures[pipeline])
            else:
                # the launcher loads it into its server and then says `ready` (the gateway waits for that)
                state(pipeline, state="built", phase="loading into the server")
    return failures


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--profile", default=os.environ.get("MODEL_PROFILE", "demo"), choices=PROFILES)
    parser.add_argument("--repository", type=Path, help="build into this folder instead of model_repository/")
    parser.add_argument("--state-dir", type=Path, default=os.environ.get("BUILD_STATE_DIR") or None,
                        help="write each pipeline's state and progress there (gateway/build_state.py)")
    parser.add_argument("pipelines", nargs="*", default=PIPELINES, help=f"any of {PIPELINES}")
    args = parser.parse_args()
    instruction_set.pin()  # before anything imports torch; the training workers inherit it
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    if args.profile == "demo":
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
    if args.repository:
        use_repository(args.repository)
    use_trained_dir()
    if args.state_dir:
        os.environ["BUILD_STATE_DIR"] = str(args.state_dir)  # the training workers write their steps there
    start = time.monotonic()
    for name in args.pipelines:
        if name not in PIPELINES:
            parser.error(f"unknown pipeline {name!r}; choose from {PIPELINES}")
    failures = build_all(args.pipelines, args.profile, StateWriter(args.state_dir))
    print(f"make model: {len(args.pipelines) - len(failures)} of {len(args.pipelines)} pipeline(s) built, profile "
          f"{args.profile}, into {args.repository or MODEL_REPOSITORY}/, {time.monotonic() - start:.1f}s"
          + (f"; FAILED: {', '.join(failures)}" if failures else ""), flush=True)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
