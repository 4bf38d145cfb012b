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
- Precision (`precision`): auto, the shipped default, is bf16 inference and KV cache where the CPU computes bf16
  natively (AVX512_BF16 or AMX: 1.6-1.9x f32's tokens/s on this project's EPYC, and a held-out parse share not
  below f32's, docs/performance.md "The editor workload"), f32 elsewhere (AVX2 alone, where bf16 would be
  emulated and slower). f32 is the exact mode the fidelity tests pin: tokens and logprobs follow the torch
  reference (the CPU plugin's own default, bf16 and a compressed KV cache, drift from it).
- Prefix caching (on by default): a prompt that starts with a recently served one prefills only its new tokens,
  from KV blocks the pipeline kept (an editor resends the file up to the cursor on every pause). The cache is
  bounded by `kv_cache_tokens` (0: it grows on demand to what the running rows need, and cached prefixes live
  in the blocks finished rows left, evicted least recently used first). openvino.genai#4047: with prefix
  caching a prompt the bounded cache cannot hold is silently ended with no tokens; so a bound under one context
  window is refused at load, and a request the pipeline ends with no token fails as retryable (Overloaded).
- Prompt lookup (`prompt_lookup_tokens` > 0): drafts of that many ids copied from the prompt where its last
  n-gram occurred before, checked in one forward (greedy output unchanged; code repeats its identifiers).
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
from gptj_generator.healing import choose
from gptj_generator.openvino_scorer import Scorer, ScoringSession
from gptj_generator.sampling import new_generator, token_logprob
from gptj_generator.seam import DecodeLoopDied, GenerationRequest, TokenLogprob, emit
from stage_common.errors import Overloaded

_log = logging.getLogger("stage")
WEIGHTS_FILE = "openvino_model.bin"
KV_BLOCK_TOKENS = 32  # the CPU plugin's paged KV block (tokens); kv_cache_tokens is rounded up to whole blocks


def fold_seed(seed: int) -> int:
    """A seed of up to 64 bits as the pipeline's 32-bit one; seeds differing only in their high half differ."""
    return (seed ^ (seed >> 32)) & 0xFFFFFFFF


PRECISIONS = ("f32", "bf16")  # f32: the exact mode (the fidelity tests'); int8/int4 are weight formats of the IR
PRECISION_SETTINGS = ("auto", *PRECISIONS)  # auto: bf16 where the CPU computes it natively, else f32
PROMPT_LOOKUP_NGRAM = 3  # the longest n-gram of the prompt's end looked up for a draft (OpenVINO GenAI's sample)


def available_cores() -> int:
    """The cores this process may run on (its CPU affinity: a container's or taskset's share, not the host's)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # no affinity API (macOS)
        return max(1, os.cpu_count() or 1)


def resolve_threads(threads: int) -> int:
    """`openvino_threads`: 0 follows the cores this instance may use; a positive count is taken as it is."""
    if threads < 0:
        raise ValueError(f"openvino_threads must be 0 (the cores available) or more, not {threads}")
    return threads or available_cores()


def cpu_capabilities() -> list[str]:
    """The CPU plugin's OPTIMIZATION_CAPABILITIES here ('BF16' where the CPU has AVX512_BF16 or AMX)."""
    import openvino

    return list(openvino.Core().get_property("CPU", "OPTIMIZATION_CAPABILITIES"))


def usable_precision(precision: str, capabilities: Sequence[str] | None = None) -> str:
    """The precision the engine runs for the `precision` setting on a CPU with `capabilities` (this one's by
    default): auto is bf16 where the CPU computes it natively, else f32; bf16 asked for where it does not falls
    back to f32 with a warning (a config is shared by every machine an image runs on); f32 is f32."""
    if precision not in PRECISION_SETTINGS:
        raise ValueError(f"precision must be one of {list(PRECISION_SETTINGS)}, not {precision!r}")
    if precision == "f32":
        return precision
    native_bf16 = "BF16" in (cpu_capabilities() if capabilities is None else capabilities)
    if precision == "bf16" and not native_bf16:
        _log.warning("codegen OpenVINO engine: precision bf16 asked for, but this CPU has no AVX512_BF16 or AMX: "
                     "running f32")
    return "bf16" if native_bf16 else "f32"


def pipeline_properties(threads: int, precision: str = "f32") -> dict:
    if precision not in PRECISIONS:
        raise ValueError(f"precision must be one of {list(PRECISIONS)}, not {precision!r}")
    return {"INFERENCE_PRECISION_HINT": precision, "KV_CACHE_PRECISION": precision,
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
    name = "openvino"  # its alternatives come from the scorer (the pipeline gives the chosen token's logprob only)

    def __init__(self, ir_dir: Path, token_bytes: Sequence[bytes], max_batch_size: int, max_tokens_limit: int,
                 threads: int = 1, on_progress: Callable[["OpenVINOEngine"], None] | None = None,
                 cancel_poll_seconds: float = 0.1, prefill_chunk_tokens: int = 256, max_pending: int = 256,
                 max_stop_words: int = 8, max_stop_word_chars: int = 64, kv_cache_tokens: int = 0,
                 max_scored_rows: int = 1, prefix_caching: bool = True, prompt_lookup_tokens: int = 0,
                 precision: str = "auto"):
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
        self.threads, self.precision = resolve_threads(threads), usable_precision(precision)
        properties = pipeline_properties(self.threads, self.precision)
        self.scorer = Scorer(self.ir_dir, properties)  # compiled when a request first needs it
        # the scorer's work runs on the loop thread, between the batch's steps (_may_run): rows that have it follow
        # every generated id, and prompt tokens it prefills per turn, are bounded as the pipeline's own prefill is
        self.max_scored_rows = max(1, max_scored_rows)
        self.prefill_chunk_tokens = max(1, prefill_chunk_tokens)
        scheduler = openvino_genai.SchedulerConfig()
        scheduler.max_num_seqs = max_batch_size
        self.prompt_lookup_tokens = max(0, prompt_lookup_tokens)
        # tokens per step: every running sequence's next one (and its draft, with prompt lookup) plus a prompt
        # chunk (split-fuse: a long prompt is fed over several steps between the running batch's decode steps,
        # never stalling it for its whole prefill)
        scheduler.max_num_batched_tokens = max_batch_size * (1 + self.prompt_lookup_tokens) + \
            max(1, prefill_chunk_tokens)
        scheduler.dynamic_split_fuse = True
        self.prefix_caching, self.kv_cache_tokens = bool(prefix_caching), max(0, kv_cache_tokens)
        if self.kv_cache_tokens:  # openvino.genai#4047: a bound that cannot hold one full prompt ends it with no tokens
            if self.kv_cache_tokens < self.context_window + KV_BLOCK_TOKENS:
                raise ValueError(f"kv_cache_tokens {kv_cache_tokens} cannot hold one context window "
                                 f"({self.context_window} tokens) and a block: use 0 or at least "
                                 f"{self.context_window + KV_BLOCK_TOKENS}")
            scheduler.num_kv_blocks = -(-self.kv_cache_tokens // KV_BLOCK_TOKENS)
        scheduler.enable_prefix_caching = self.prefix_caching
        self.pipe = openvino_genai.ContinuousBatchingPipeline(
            str(self.ir_dir), scheduler, "CPU",
            {**properties, **({"prompt_lookup": True} if self.prompt_lookup_tokens else {})})
        self._ids = itertools.count(1)  # request ids must be unique while in flight
        self._warm_up()
        # the plugin runs on its own repacked copy of the weights now: the mapped file's pages are a second copy
        self.dropped_bytes = drop_file_pages(self.ir_dir / WEIGHTS_FILE)
        self._running: dict[int, _Live] = {}
        _log.info("codegen OpenVINO engine: %s precision, %d inference thread(s) (of %d cores available), %s "
                  "weights, prefix caching %s (KV cache %s), prompt lookup %s", self.precision, self.threads,
                  available_cores(), self.weights, "on" if self.prefix_caching else "off",
                  f"{self.kv_cache_tokens} tokens" if self.kv_cache_tokens else "grows on demand",
                  f"{self.prompt_lookup_tokens} draft ids" if self.prompt_lookup_tokens else "off")
        self._start_loop("openvino-step-loop", token_bytes=token_bytes, eos=self.eos, max_batch_size=max_batch_size,
                         max_tokens_limit=max_tokens_limit, max_pending=max_pending, max_stop_words=max_stop_words,
                         max_stop_word_chars=max_stop_word_chars, on_progress=on_progress,
                         cancel_poll_seconds=cancel_poll_seconds)

    def _warm_up(self) -> None:
        """One request with a prefill and a decode step: compiles what the first request would otherwise wait
        for, and leaves the plugin's own weights in place before the mapped file's pages are dropped."""
        config = self._generation_config(GenerationRequest([self.eos] * 8, 2))
        self.pipe.add_request(next(self._ids), self._prompt([self.eos] * 8), config)
        while self.pipe.has_non_finished_requests():
            self.pipe.step()

    def settings(self) -> dict:
        """What this engine runs with (the start-up log says the same): for /health or a metrics info line."""
        return {"engine": self.name, "precision": self.precision, "threads": self.threads, "weights": self.weights,
                "prefix_caching": self.prefix_caching, "kv_cache_tokens": self.kv_cache_tokens,
                "prompt_lookup_tokens": self.prompt_lookup_tokens}

    def cache_stats(self) -> dict:
        """The pipeline's KV-cache figures (PipelineMetrics): use now, its average and peak (per cent of the
        blocks allocated), and the bytes allocated; the last step's. The pipeline (2026.4) counts no prefix-cache
        hits: a hit shows as a prompt that needs fewer prefill steps. Callable from any thread: step() holds the
        GIL, so this never runs inside one."""
        metrics = self.pipe.get_metrics()
        return {"cache_usage_percent": float(metrics.cache_usage), "avg_cache_usage_percent":
                float(metrics.avg_cache_usage), "max_cache_usage_percent": float(metrics.max_cache_usage),
                "kv_cache_bytes": int(metrics.kv_cache_size_in_bytes), "requests": int(metrics.requests),
                "scheduled_requests": int(metrics.scheduled_requests)}

    # ---- the seam (engine_loop.py does the rest: a request is queued as its Delivery) ---------------------------
    def _holding(self) -> list:
        return [live.delivery for live in self._running.values()]

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
        rng = new_generator(request.sampling)  # numpy's (None when greedy): the engines' one sampler draws from it
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
        # back as an id, so only the pipeline's own refusals land here): IGNORED = no room in the KV cache; ended
        # with no token at all (finished or not) = the prompt did not fit the cache (openvino.genai#4047)
        if status == self._genai.GenerationStatus.IGNORED or not delivery.generated:
            delivery.fail(Overloaded(f"the OpenVINO pipeline ended the request with no token ({status.name}; the "
                                     f"KV cache could not hold its prompt): retry later"))
        else:
            delivery.fail(RuntimeError(f"the OpenVINO pipeline ended the request ({status.name})"))
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
        if self.prompt_lookup_tokens:  # every request of a prompt-lookup pipeline must say how it drafts
            config.num_assistant_tokens, config.max_ngram_size = self.prompt_lookup_tokens, PROMPT_LOOKUP_NGRAM
        return config
