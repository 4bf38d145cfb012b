"""The OpenVINO engine (engine seam: seam.py), the default on CPU instances: OpenVINO GenAI's
ContinuousBatchingPipeline over the IR `make model` exports (build/openvino_export.py). Its scheduler, paged KV
cache and threads do the batching; this file feeds it, reads it and keeps the seam's promises. No Triton, no torch.

What the pipeline does not do for us (docs/pipelines.md, "The OpenVINO engine"):
- Nobody steps it: one thread here admits requests, calls `step()` and reads every handle after each step. All
  pipeline calls happen on that thread. `step()` holds the GIL for the whole step (its Python binding does not
  release it), so the stub's other threads wait up to one step; the step's tokens are bounded by the scheduler's
  max_num_batched_tokens, which bounds that wait too.
- It checks nothing: an id outside the vocabulary embeds garbage, a prompt past n_positions corrupts its
  batch-mates or fails the step, a duplicate request id breaks step(). So every request is checked (seam.Limits)
  before add_request, ids come from a counter, and a step that raises cancels every running handle, steps once
  to free them and fails those requests alone (DecodeLoopDied); the ones waiting for a row go on.
- An unset rng_seed is 0 (every unseeded request would draw the same tokens): a seed is always set, drawn at
  random when the request has none. Seeds are 32-bit there: a 64-bit seed is folded.
- Logprobs are the chosen token's only (of the raw logits), and there is no logits hook. What needs the logits
  (top alternatives, the prompt's logprobs for echo, token healing's constrained first ids) comes from a scorer:
  a plain compile of the same IR (openvino_scorer.py), fed only the requests that ask.
- Stop words, end-of-text and max_tokens are decided by delivery.py, as for the torch engine; a request it ends
  early (stop word, client gone) is cancelled in the pipeline, which frees its KV blocks at the next step.
- Precision: inference and KV cache in f32 (this CPU family defaults to bf16 and an f16 KV cache: tokens and
  logprobs would drift from the torch reference).
"""
from __future__ import annotations

import itertools
import json
import logging
import os
from collections import deque
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Sequence

import numpy as np

from gptj_generator.delivery import Delivery
from gptj_generator.engine_loop import EngineLoop
from gptj_generator.file_pages import drop_file_pages
from gptj_generator.healing import AllowedIds, choose
from gptj_generator.openvino_scorer import Scorer, ScoringSession, token_logprob
from gptj_generator.seam import (MAX_TOP_LOGPROBS, DecodeLoopDied, GenerationRequest, Limits, Sink, TokenLogprob,
                                 emit)
from stage_common.errors import Overloaded

_log = logging.getLogger("stage")
WEIGHTS_FILE = "openvino_model.bin"


def fold_seed(seed: int) -> int:
    """A seed of up to 64 bits as the pipeline's 32-bit one; seeds differing only in their high half differ."""
    return (seed ^ (seed >> 32)) & 0xFFFFFFFF


def pipeline_properties(threads: int) -> dict:
    return {"INFERENCE_PRECISION_HINT": "f32", "KV_CACHE_PRECISION": "f32",
            "INFERENCE_NUM_THREADS": max(1, threads),
            "sampler_num_threads": 1,  # default: one per hardware thread, beside the inference threads
            "ENABLE_CPU_PINNING": False}  # instances sharing a host must not pin to the same cores


def _needs_scorer(delivery: Delivery) -> bool:
    """Top alternatives, the prompt's logprobs (echo) or token healing: what the pipeline cannot give."""
    request = delivery.request
    return bool(request.logprobs or request.prompt_logprobs or delivery.healing is not None)


@dataclass(eq=False)
class _Live:
    """A request in the pipeline: its delivery and the pipeline's handle."""
    delivery: Delivery
    handle: object
    session: ScoringSession | None = None  # the scorer's, for a request that wants top alternatives


class OpenVINOEngine(EngineLoop):
    name = "openvino"
    max_top_logprobs = MAX_TOP_LOGPROBS  # from the scorer (the pipeline gives the chosen token's logprob only)

    def __init__(self, ir_dir: Path, token_bytes: Sequence[bytes], max_batch_size: int, max_tokens_limit: int,
                 threads: int = 1, on_progress: Callable[["OpenVINOEngine"], None] | None = None,
                 cancel_poll_seconds: float = 0.1, prefill_chunk_tokens: int = 256, max_pending: int = 256,
                 max_stop_words: int = 8, max_stop_word_chars: int = 64, kv_cache_gb: int = 0,
                 max_scored_rows: int = 1):
        import openvino_genai

        self._genai = openvino_genai
        self.ir_dir = Path(ir_dir)
        config = json.loads((self.ir_dir / "config.json").read_text())
        self.eos = config.get("eos_token_id")
        if not isinstance(self.eos, int):
            raise ValueError(f"{self.ir_dir}/config.json has no eos_token_id: the pipeline needs one")
        self.context_window, self.vocab_size = config["n_positions"], config["vocab_size"]
        self.weights = json.loads((self.ir_dir / "export.json").read_text()).get("weights", "?") \
            if (self.ir_dir / "export.json").exists() else "?"
        self.token_bytes = token_bytes
        self.allowed_ids = AllowedIds(token_bytes)  # token healing's constraint
        self.scorer = Scorer(self.ir_dir, pipeline_properties(threads))  # compiled when a request first needs it
        # the scorer's work runs on the loop thread, between the batch's steps (_may_run): rows that have it follow
        # every generated id, and prompt tokens it prefills per turn, are bounded as the pipeline's own prefill is
        self.max_scored_rows = max(1, max_scored_rows)
        self.prefill_chunk_tokens = max(1, prefill_chunk_tokens)
        self.limits = Limits(self.context_window, self.vocab_size, max_tokens_limit, max_stop_words,
                             max_stop_word_chars, self.max_top_logprobs)
        scheduler = openvino_genai.SchedulerConfig()
        scheduler.max_num_seqs = max_batch_size
        # tokens per step: every running sequence's next one plus a prompt chunk (split-fuse: a long prompt is
        # fed over several steps between the running batch's decode steps, never stalling it for its whole prefill)
        scheduler.max_num_batched_tokens = max_batch_size + max(1, prefill_chunk_tokens)
        scheduler.dynamic_split_fuse = True
        scheduler.cache_size = kv_cache_gb  # 0: the paged KV cache grows on demand
        scheduler.enable_prefix_caching = False
        self.pipe = openvino_genai.ContinuousBatchingPipeline(str(self.ir_dir), scheduler, "CPU",
                                                              pipeline_properties(threads))
        self._ids = itertools.count(1)  # request ids must be unique while in flight
        self._warm_up()
        # the plugin runs on its own repacked copy of the weights now: the mapped file's pages are a second copy
        self.dropped_bytes = drop_file_pages(self.ir_dir / WEIGHTS_FILE)
        self._running: dict[int, _Live] = {}
        self._start_loop(max_batch_size, max_pending, on_progress, cancel_poll_seconds, "openvino-step-loop")

    def _warm_up(self) -> None:
        """One request with a prefill and a decode step: compiles what the first request would otherwise wait
        for, and leaves the plugin's own weights in place before the mapped file's pages are dropped."""
        config = self._generation_config(GenerationRequest([self.eos] * 8, 2))
        self.pipe.add_request(next(self._ids), self._prompt([self.eos] * 8), config)
        while self.pipe.has_non_finished_requests():
            self.pipe.step()

    # ---- the seam ---------------------------------------------------------------------------------------
    def validate(self, request: GenerationRequest) -> None:
        self.limits.check(request)

    def submit(self, request: GenerationRequest, sink: Sink) -> None:
        """Queue a request (BadInput if it is unusable, Overloaded if too many wait for a row already); it
        enters the pipeline at the loop's next turn."""
        self.validate(request)
        delivery = Delivery(request, sink, self.token_bytes, self.eos, self.allowed_ids)
        self._enqueue(delivery, delivery)

    def holds(self, key: str) -> bool:
        with self._wakeup:
            deliveries = list(self._pending) + list(self._admitting) + [live.delivery for live in self._running.values()]
        return any(d.key == key and not d.ended for d in deliveries)

    @property
    def running(self) -> int:
        """Requests holding a row (in the pipeline), and those being admitted to one."""
        return len(self._running) + len(self._admitting)

    # ---- the loop (the only thread that calls the pipeline) ---------------------------------------------------
    def _loop(self) -> None:
        while (turn := self._next_turn()) is not None:
            self._admit(turn.admitted, turn.cancelled_keys, turn.poll)
            self._drop_gone(turn.cancelled_keys, turn.poll)
            taking_part = len(self._running)
            if self._running:
                self._step()
            self._end_turn(turn, taking_part)
        with self._wakeup:
            lives, waiting = list(self._running.values()), list(self._pending)
            self._pending, self._running = deque(), {}
        for live in lives:  # the pipeline frees their KV blocks at one more step
            live.handle.cancel()
        if lives:
            self.pipe.step()
        for delivery in [live.delivery for live in lives] + waiting:
            delivery.fail(RuntimeError("the generator is shutting down"))

    def _may_run(self, delivery: Delivery, admitted: list[Delivery]) -> bool:
        """A request that needs the scorer waits while `max_scored_rows` rows have it follow their ids (one
        unbatched forward per id each: without a bound, 8 such rows slowed their batch-mates to 0.16x,
        bench_logprobs.py), and while this turn's scorer prefills already reach `prefill_chunk_tokens` (the first
        always goes: a prompt is at most the context window). Requests that need nothing of it go ahead."""
        request = delivery.request
        if not _needs_scorer(delivery):
            return True
        if request.logprobs:
            following = sum(live.session is not None for live in self._running.values())
            following += sum(bool(d.request.logprobs) for d in admitted)
            if following >= self.max_scored_rows:
                return False
        prefilled = sum(len(d.request.input_ids) for d in admitted if _needs_scorer(d))
        return prefilled == 0 or prefilled + len(request.input_ids) <= self.prefill_chunk_tokens

    def _admit(self, admitted: list[Delivery], keys: set[str], poll: bool) -> None:
        """Each admitted request enters the pipeline, is ended (stopped by key, client gone) or fails alone."""
        for delivery in admitted:
            if delivery.gone(keys, poll):
                continue
            request_id = next(self._ids)
            try:
                emit(delivery.request, "scheduled")
                session, chosen = self._score(delivery)
                if delivery.ended:  # scored only, or ended within the healed ids
                    continue
                request = delivery.request
                handle = self.pipe.add_request(request_id, self._prompt(list(request.input_ids) + chosen),
                                               self._generation_config(request, request.max_tokens - len(chosen)))
            except Exception as exc:  # noqa: BLE001 - the pipeline refused this one: the others go on
                delivery.fail(exc)
                continue
            with self._wakeup:
                self._running[request_id] = _Live(delivery, handle, session)
        with self._wakeup:
            self._admitting = []

    def _score(self, delivery: Delivery) -> tuple[ScoringSession | None, list[int]]:
        """What needs logits, from the scorer, before the pipeline takes the request: the prompt's logprobs, and
        token healing's constrained first ids (chosen as the torch engine chooses them; the pipeline then goes on
        from the prompt and these). Returns the session (kept for a request that wants top alternatives, which
        then scores each id the pipeline chooses) and the ids chosen here."""
        request, healing = delivery.request, delivery.healing
        top = request.logprobs or 0
        if not _needs_scorer(delivery):
            return None, []
        session = self.scorer.session()
        session.feed(list(request.input_ids))
        if request.prompt_logprobs:
            ids = request.input_ids
            delivery.set_prompt_logprobs([None] + [token_logprob(session.row(i), ids[i + 1], top)
                                                   for i in range(len(ids) - 1)])
        chosen: list[int] = []
        rng = np.random.default_rng(request.sampling.seed)
        while healing is not None and healing.active and not delivery.ended:
            token = choose(session.next_row, healing.allowed(), request.sampling, rng)
            healing.advance(token)
            chosen.append(token)
            logprob = token_logprob(session.next_row, token, top) if delivery.wants_logprobs else None
            if delivery.accept(token, logprob) and (healing.active or top):
                session.feed([token])
        return (session if top else None), chosen

    def _drop_gone(self, keys: set[str], poll: bool) -> None:
        if not keys and not poll:
            return
        for request_id, live in list(self._running.items()):
            if live.delivery.gone(keys, poll):
                self._remove(request_id, cancel=True)

    def _step(self) -> None:
        rows = len(self._running)
        try:
            self.pipe.step()
        except Exception as exc:  # noqa: BLE001 - a failed step leaves every running request's state unknown
            self._recover(exc)
            return
        self.steps += 1
        self.rows_decoded += rows
        for request_id, live in list(self._running.items()):
            if not self._read(live):
                self._remove(request_id, cancel=live.handle.get_status() == self._genai.GenerationStatus.RUNNING)

    def _read(self, live: _Live) -> bool:
        """Hand this step's ids to the request's delivery; False once the request is done here."""
        delivery, handle = live.delivery, live.handle
        try:
            while handle.can_read():
                for output in handle.read().values():
                    ids = list(output.generated_ids)
                    logprobs = list(output.generated_log_probs) if delivery.wants_logprobs else []
                    for i, token in enumerate(ids):
                        if live.session is not None:  # top alternatives: the scorer follows the pipeline's ids
                            logprob = token_logprob(live.session.next_row, token, delivery.request.logprobs)
                        else:
                            logprob = TokenLogprob(token, float(logprobs[i])) if i < len(logprobs) else None
                        if not delivery.accept(token, logprob):
                            return False
                        if live.session is not None:
                            live.session.feed([token])
            status = handle.get_status()
        except Exception as exc:  # noqa: BLE001 - this handle alone
            delivery.fail(exc)
            return False
        if status == self._genai.GenerationStatus.RUNNING:
            return True
        # ended by the pipeline before delivery.py ended it (max_new_tokens equals max_tokens and the eos comes
        # back as an id, so only the pipeline's own refusals land here): IGNORED = no room in the KV cache
        delivery.fail(Overloaded(f"the OpenVINO pipeline ended the request ({status.name}): retry later")
                      if status == self._genai.GenerationStatus.IGNORED else
                      RuntimeError(f"the OpenVINO pipeline ended the request ({status.name})"))
        return False

    def _remove(self, request_id: int, cancel: bool) -> None:
        with self._wakeup:
            live = self._running.pop(request_id, None)
        if live is not None and cancel:
            live.handle.cancel()  # its blocks are freed at the next step

    def _recover(self, exc: Exception) -> None:
        """A step raised: cancel every running request, step once so the pipeline frees them (a fresh request
        then gets the tokens of a fresh pipeline), fail them; the waiting ones go on."""
        with self._wakeup:
            lives, self._running = list(self._running.values()), {}
            self.restarts += 1
        _log.error("codegen OpenVINO step failed (%r); failing %d running request(s)", exc, len(lives), exc_info=exc)
        for live in lives:
            try:
                live.handle.cancel()
            except Exception:  # noqa: BLE001 - going anyway
                pass
        try:
            self.pipe.step()
        except Exception:  # noqa: BLE001 - nothing left in it to fail
            _log.exception("codegen OpenVINO step after a failed one raised too")
        for live in lives:
            live.delivery.fail(DecodeLoopDied(f"the OpenVINO step failed: {exc!r}"))

    # ---- pipeline inputs ---------------------------------------------------------------------------------------
    @staticmethod
    def _prompt(ids: Sequence[int]):
        import openvino

        return openvino.Tensor(np.array([list(ids)], dtype=np.int64))  # int64 only: int32 is refused

    def _generation_config(self, request: GenerationRequest, max_new_tokens: int | None = None):
        config = self._genai.GenerationConfig()
        config.max_new_tokens = request.max_tokens if max_new_tokens is None else max_new_tokens
        config.eos_token_id = self.eos
        config.stop_token_ids = {self.eos}  # must hold eos_token_id; the eos comes back as the last id
        sampling = request.sampling
        if not sampling.greedy:
            config.do_sample = True
            config.temperature, config.top_p = sampling.temperature, sampling.top_p
            if sampling.top_k > 0:
                config.top_k = sampling.top_k
            config.rng_seed = fold_seed(sampling.seed if sampling.seed is not None
                                        else int.from_bytes(os.urandom(4), "little"))
        config.logprobs = 1 if request.logprobs is not None else 0
        return config
