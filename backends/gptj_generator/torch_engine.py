"""The torch engine (engine seam: seam.py): iteration-level (continuous) batching for a transformers causal LM
with a KV cache, no Triton. The reference the OpenVINO engine is held to, and the engine of CUDA instances.

One background thread runs the decode loop. Each step feeds the last token of every running
sequence in one forward pass over a shared, left-padded KV cache (explicit attention_mask and
position_ids keep every row equal to its unpadded self). New requests are prefilled (those that
arrived together in one padded pass) and join the batch at the next step; a finished or cancelled
sequence leaves it at once, and the all-padding columns this leaves at the left are trimmed.
Prefill is chunked: while others decode, each loop turn feeds at most prefill_chunk_tokens prompt
tokens before the decode step, so a long prompt joining never stalls the running batch for its
whole prefill; and only the last prompt position goes through the vocabulary projection.
"""
from __future__ import annotations

import logging
from collections import deque
from dataclasses import dataclass, field
from typing import Callable, Sequence

import torch
from transformers import DynamicCache

from gptj_generator.delivery import Delivery
from gptj_generator.engine_loop import EngineLoop
from gptj_generator.healing import choose
from gptj_generator.kv_cache import growing_cache
from gptj_generator.sampling import new_generator, sample, token_logprob
from gptj_generator.seam import DecodeLoopDied, GenerationRequest, emit

_log = logging.getLogger("stage")


@dataclass(eq=False)
class _Sequence:
    delivery: Delivery
    generator: torch.Generator | None
    cached: int = 0  # real (non-padding) tokens in the KV cache; also the next position id

    @property
    def request(self) -> GenerationRequest:
        return self.delivery.request

    @property
    def key(self) -> str | None:
        return self.delivery.key

    @property
    def ended(self) -> bool:
        return self.delivery.ended

    @property
    def last_token(self) -> int:
        return self.delivery.generated[-1]


@dataclass(eq=False)
class _Prefill:
    """Prompts admitted together, left-padded into one batch, fed to their own cache a chunk of
    columns per loop turn; they join the running batch when the last column is in."""
    seqs: list[_Sequence]
    ids: torch.Tensor  # [rows, width]
    mask: torch.Tensor  # [rows, width]: 1 = real token, 0 = left padding
    cache: DynamicCache = field(default_factory=growing_cache)
    fed: int = 0  # columns already in the cache


class TorchEngine(EngineLoop):
    name = "torch"  # its alternatives come from the logits its batched step has already

    def __init__(self, model, token_bytes: Sequence[bytes], eos_token_id: int | None, max_batch_size: int,
                 max_tokens_limit: int, device: torch.device | str = "cpu",
                 on_progress: Callable[["TorchEngine"], None] | None = None, cancel_poll_seconds: float = 0.1,
                 prefill_token_budget: int = 2048, prefill_chunk_tokens: int = 256, max_pending: int = 256,
                 max_stop_words: int = 8, max_stop_word_chars: int = 64):
        self.model = model
        self.prefill_token_budget = prefill_token_budget  # padded prompt tokens prefilled as one group
        self.prefill_chunk_tokens = prefill_chunk_tokens  # padded prompt tokens fed per turn while others decode
        self.context_window = model.config.n_positions
        # the embedding's row count, the real bound: an id outside it makes the shared forward raise
        self.vocab_size = model.get_input_embeddings().num_embeddings
        self.device = torch.device(device)
        self._running: list[_Sequence] = []
        self._prefilling: deque[_Prefill] = deque()  # taken from pending, prompts being fed
        self._cache: DynamicCache | None = None
        self._mask: torch.Tensor | None = None  # [rows, cache length]: 1 = real token, 0 = left padding
        self._start_loop("gptj-decode-loop", token_bytes=token_bytes, eos=eos_token_id, max_batch_size=max_batch_size,
                         max_tokens_limit=max_tokens_limit, max_pending=max_pending, max_stop_words=max_stop_words,
                         max_stop_word_chars=max_stop_word_chars, on_progress=on_progress,
                         cancel_poll_seconds=cancel_poll_seconds)

    # ---- requests ---------------------------------------------------------------------------
    def _entry(self, delivery: Delivery) -> _Sequence:
        """A request joins the running batch at the step after its prompt is fed; it samples from its own generator,
        on the logits' device."""
        return _Sequence(delivery, new_generator(delivery.request.sampling, self.device))

    def _holding(self) -> list:
        return list(self._running) + [seq for group in self._prefilling for seq in group.seqs]

    @property
    def running(self) -> int:
        """Sequences holding a row: decoding, or having their prompt fed."""
        return len(self._running) + sum(len(group.seqs) for group in self._prefilling)

    # ---- decode loop --------------------------------------------------------------------------
    def _run_loop(self) -> None:
        """Runs the decode loop; if it dies, every running and waiting request fails at once and the
        loop starts again on a fresh cache, so new requests are served."""
        while True:
            try:
                self._loop()
                return
            except BaseException as exc:  # noqa: BLE001 - nothing may end the loop for good
                with self._wakeup:
                    prefilling = [seq for group in self._prefilling for seq in group.seqs]
                    doomed = self._running + [s for s in prefilling if s not in self._running] + list(self._pending)
                    doomed += [s for s in self._admitting if s not in doomed and not s.ended]
                    self._pending, self._prefilling, self._admitting = deque(), deque(), []
                    self._running, self._cache, self._mask = [], None, None
                    self.restarts += 1
                _log.error("codegen decode loop died (%r); failing %d request(s) and restarting it", exc,
                           len(doomed), exc_info=exc)
                for seq in doomed:
                    self._fail(seq, DecodeLoopDied(f"the decode loop failed: {exc!r}"))

    @staticmethod
    def _fail(seq: _Sequence, error: BaseException) -> None:
        seq.delivery.fail(error)

    def _loop(self) -> None:
        # admitted requests sit in _admitting between the two queues: the supervisor fails them too if the loop
        # dies before they are in
        while (turn := self._next_turn()) is not None:
            self._admit(turn.admitted, turn.cancelled_keys, turn.poll)
            # a failure from here on (e.g. in the forward pass) leaves the batch's cache unusable: the
            # supervisor fails everything in the engine and restarts the loop on a fresh cache
            self._drop_cancelled(turn.cancelled_keys, turn.poll)
            taking_part = self.running
            self._feed_prompts()
            if self._running:
                self._decode_step()
            self._end_turn(turn, taking_part)
        prefilling = [seq for group in self._prefilling for seq in group.seqs]
        for seq in self._running + prefilling + list(self._pending):
            self._fail(seq, RuntimeError("the generator is shutting down"))

    def _admit(self, admitted: list[_Sequence], keys: set[str], poll: bool) -> None:
        """Admission is all-or-fail: every admitted request ends up being prefilled, finished (cancelled) or
        failed, never lost between _pending and _prefilling (a BLS caller would wait for it forever)."""
        try:
            joining = [seq for seq in admitted if not seq.delivery.gone(keys, poll)]
            for seq in joining:
                emit(seq.request, "scheduled")
                if seq.request.prompt_logprobs:  # a score-only request (max_tokens 0) ends here
                    seq.delivery.set_prompt_logprobs(self._prompt_logprobs(seq.request))
            groups = self._prefill_groups([seq for seq in joining if not seq.ended])
        except Exception as exc:  # noqa: BLE001 - e.g. a tensor copy to the device: the running batch is intact
            _log.error("codegen admission failed (%r); failing the %d request(s) admitted", exc, len(admitted),
                       exc_info=exc)
            for seq in admitted:
                if not seq.ended:
                    self._fail(seq, exc)
            groups = []
        with self._wakeup:
            self._prefilling += groups
            self._admitting = []

    @torch.inference_mode()
    def _prompt_logprobs(self, request: GenerationRequest) -> list:
        """Echo's logprobs: one forward over the prompt with every position's logits (the batched prefill
        projects the last position only); only requests that ask pay for it."""
        ids = list(request.input_ids)
        logits = self.model(input_ids=torch.tensor([ids], dtype=torch.long, device=self.device)).logits[0].float()
        return [None] + [token_logprob(logits[i], ids[i + 1], request.logprobs) for i in range(len(ids) - 1)]

    def _prefill_groups(self, seqs: list[_Sequence]) -> list[_Prefill]:
        """Requests admitted together are prefilled together, up to a padded-token budget (the
        attention scores of a prefill grow with rows x length^2)."""
        groups: list[list[_Sequence]] = []
        for seq in seqs:
            group = groups[-1] if groups else None
            width = max([len(seq.request.input_ids)] + [len(s.request.input_ids) for s in group or []])
            if group is None or (len(group) + 1) * width > self.prefill_token_budget:
                groups.append([seq])
            else:
                group.append(seq)
        return [self._left_padded(group) for group in groups]

    def _left_padded(self, seqs: list[_Sequence]) -> _Prefill:
        width = max(len(s.request.input_ids) for s in seqs)
        ids = torch.zeros(len(seqs), width, dtype=torch.long)
        mask = torch.zeros(len(seqs), width, dtype=torch.long)
        for row, seq in enumerate(seqs):
            prompt = seq.request.input_ids
            ids[row, width - len(prompt):] = torch.tensor(list(prompt), dtype=torch.long)
            mask[row, width - len(prompt):] = 1
            seq.cached = len(prompt)
        return _Prefill(seqs, ids.to(self.device), mask.to(self.device))

    def _feed_prompts(self) -> None:
        """Feed prompt chunks, oldest group first: at most prefill_chunk_tokens (padded) while a batch
        is decoding, all of them while none is (nobody waits then)."""
        budget = self.prefill_chunk_tokens
        while self._prefilling and (budget > 0 or not self._running):
            budget -= self._feed_chunk(self._prefilling[0], budget if self._running else None)

    @torch.inference_mode()
    def _feed_chunk(self, group: _Prefill, tokens: int | None) -> int:
        """One forward over the next columns (about `tokens` padded tokens, or all that are left) of a
        group's prompts; after the last one, each row's first token is chosen and the rows that go on
        join the running batch. Returns the tokens fed."""
        rows, width = group.ids.shape
        start = group.fed
        end = width if tokens is None else min(width, start + max(1, tokens // rows))
        mask = group.mask[:, :end]
        positions = (mask.cumsum(-1) - 1).clamp(min=0)[:, start:]
        logits = self._forward(group.ids[:, start:end], mask, positions, group.cache, logits=end == width)
        group.fed = end
        if end < width:
            return rows * (end - start)
        self._prefilling.popleft()
        greedy = logits.argmax(-1).tolist()
        keep = [row for row, seq in enumerate(group.seqs) if self._accept(seq, greedy[row], logits[row])]
        if keep:
            mask = group.mask if len(keep) == rows else self._select_rows(group.cache, group.mask, keep)
            self._join([group.seqs[row] for row in keep], group.cache, mask)
        return rows * (end - start)

    def _forward(self, ids: torch.Tensor, mask: torch.Tensor, positions: torch.Tensor, cache: DynamicCache,
                 logits: bool = True) -> torch.Tensor | None:
        """The model over new columns (appended to the cache); the next-token logits of each row's last
        column only (the vocabulary projection of every prompt position would be thrown away)."""
        hidden = self.model.base_model(input_ids=ids, attention_mask=mask, position_ids=positions,
                                       past_key_values=cache, use_cache=True).last_hidden_state
        if not logits:
            return None
        # float32 as the causal-LM head returns them (sampling in half precision is not stable)
        return self.model.get_output_embeddings()(hidden[:, -1]).float()

    @torch.inference_mode()
    def _decode_step(self) -> None:
        rows = self._running
        ids = torch.tensor([[s.last_token] for s in rows], dtype=torch.long, device=self.device)
        positions = torch.tensor([[s.cached] for s in rows], dtype=torch.long, device=self.device)
        self._mask = torch.cat([self._mask, torch.ones_like(ids)], dim=1)
        logits = self._forward(ids, self._mask, positions, self._cache)
        self.steps += 1
        self.rows_decoded += len(rows)
        greedy = logits.argmax(-1).tolist()
        keep = []
        for i, seq in enumerate(rows):
            seq.cached += 1
            if self._accept(seq, greedy[i], logits[i]):
                keep.append(i)
        if len(keep) < len(rows):
            self._keep_rows(keep)

    def _accept(self, seq: _Sequence, greedy: int, logits: torch.Tensor) -> bool:
        """Choose the next token and hand it to the request's delivery; False once the sequence is done.
        Everything here is this sequence's alone: a failure fails it and no batch-mate."""
        try:
            # the engines' one sampler (sampling.py), on this row of the step's logits where they are (no copy from
            # a GPU: array_ops.py); greedy rows take their id from the batch's one argmax
            healing, sampling = seq.delivery.healing, seq.request.sampling
            if healing is not None and healing.active:  # only ids that spell the healed prefix
                token = choose(logits, torch.as_tensor(healing.allowed(), device=logits.device), sampling,
                               seq.generator)
            else:
                token = greedy if seq.generator is None else sample(logits, sampling, seq.generator)
            if healing is not None:
                healing.advance(token)
            wanted = seq.request.logprobs
            logprob = None if wanted is None else token_logprob(logits, token, wanted)
        except Exception as exc:  # noqa: BLE001 - e.g. a sampling fault: free its row, keep the others
            self._fail(seq, exc)
            return False
        return seq.delivery.accept(token, logprob)

    # ---- the shared KV cache -------------------------------------------------------------------
    def _join(self, seqs: list[_Sequence], cache: DynamicCache, mask: torch.Tensor) -> None:
        """Append prefilled rows (left-padded like the batch) to the running batch."""
        if self._cache is None:
            self._cache, self._mask, self._running = cache, mask, list(seqs)
            return
        width, new = self._mask.shape[1], mask.shape[1]
        if new > width:
            self._left_pad(self._cache, new - width)
            self._mask = torch.nn.functional.pad(self._mask, (new - width, 0))
        elif width > new:
            self._left_pad(cache, width - new)
            mask = torch.nn.functional.pad(mask, (width - new, 0))
        for layer, joining in zip(self._cache.layers, cache.layers):
            layer.keys = torch.cat([layer.keys, joining.keys])
            layer.values = torch.cat([layer.values, joining.values])
        self._mask = torch.cat([self._mask, mask])
        self._running += seqs

    @staticmethod
    def _left_pad(cache: DynamicCache, n: int) -> None:
        for layer in cache.layers:
            layer.keys = torch.nn.functional.pad(layer.keys, (0, 0, n, 0))
            layer.values = torch.nn.functional.pad(layer.values, (0, 0, n, 0))

    @staticmethod
    def _select_rows(cache: DynamicCache, mask: torch.Tensor, keep: list[int]) -> torch.Tensor:
        """Keep these rows of a cache (in place) and its mask, dropping the columns that are padding
        in every row left; returns the new mask."""
        index = torch.tensor(keep, dtype=torch.long, device=mask.device)
        mask = mask.index_select(0, index)
        start = int(mask.any(0).long().argmax())
        for layer in cache.layers:
            layer.keys = layer.keys.index_select(0, index)[:, :, start:]
            layer.values = layer.values.index_select(0, index)[:, :, start:]
        return mask[:, start:]

    def _keep_rows(self, keep: list[int]) -> None:
        self._running = [self._running[i] for i in keep]
        if not keep:
            self._cache, self._mask = None, None
        else:
            self._mask = self._select_rows(self._cache, self._mask, keep)

    def _drop_cancelled(self, cancelled_keys: set[str], poll: bool) -> None:
        if not cancelled_keys and not poll:
            return
        keep = [i for i, seq in enumerate(self._running) if not seq.delivery.gone(cancelled_keys, poll)]
        if len(keep) < len(self._running):
            self._keep_rows(keep)
        for group in list(self._prefilling):
            keep = [i for i, seq in enumerate(group.seqs) if not seq.delivery.gone(cancelled_keys, poll)]
            if not keep:
                self._prefilling.remove(group)
            elif len(keep) < len(group.seqs):
                self._keep_prompt_rows(group, keep)

    @staticmethod
    def _keep_prompt_rows(group: _Prefill, keep: list[int]) -> None:
        """Drop rows of a group still being fed (its columns stay aligned with its ids)."""
        index = torch.tensor(keep, dtype=torch.long, device=group.ids.device)
        group.seqs = [group.seqs[i] for i in keep]
        group.ids, group.mask = group.ids.index_select(0, index), group.mask.index_select(0, index)
        for layer in group.cache.layers:
            layer.keys, layer.values = layer.keys.index_select(0, index), layer.values.index_select(0, index)
