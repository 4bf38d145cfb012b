"""One request's output, the same whichever engine chose its tokens: each chosen id goes through the request's
TextStream (UTF-8 and stop-word hold-back, text_stream.py), released ids reach the sink with their logprobs
when asked, and the request ends on end-of-text, a stop word or max_tokens; its events are emitted on the way.

Everything here is one request's alone: a failure (its sink raising, its stop-word match) fails it and no
batch-mate. Engines call `accept` once per chosen id, `cancel` when it leaves, `fail` when their step fails.
"""
from __future__ import annotations

import logging
from typing import Sequence

from gptj_generator.healing import AllowedIds, Healing
from gptj_generator.seam import GenerationRequest, Sink, TokenLogprob, emit
from gptj_generator.text_stream import TextStream

_log = logging.getLogger("stage")


class Delivery:
    def __init__(self, request: GenerationRequest, sink: Sink, token_bytes: Sequence[bytes], eos: int | None,
                 allowed_ids: AllowedIds | None = None):
        self.request, self.sink, self.eos = request, sink, eos
        # token healing: the engine constrains the first id(s) while it is active
        self.healing = Healing(allowed_ids, request.heal_prefix) if request.heal_prefix and allowed_ids else None
        # stop words are looked for after the healed prefix (it belongs to the prompt)
        self.stream = TextStream(token_bytes, request.stop_words,
                                 skip_chars=len(request.heal_prefix.decode("utf-8", errors="replace")))
        self.generated: list[int] = []
        self._held: list[TokenLogprob] = []  # logprobs of the ids the stream holds back, in order
        self._prompt_logprobs: list | None = None  # the prompt's (echo), sent with the first chunk
        self.ended = False  # finished, cancelled or failed: its sink has had its last word

    def queued(self) -> None:
        """Accepted by the engine (called once it is queued, never for a request refused)."""
        emit(self.request, "queued", prompt_tokens=len(self.request.input_ids), max_tokens=self.request.max_tokens)

    @property
    def key(self) -> str | None:
        return self.request.key

    @property
    def wants_logprobs(self) -> bool:
        return self.request.logprobs is not None

    def set_prompt_logprobs(self, logprobs: list[TokenLogprob | None]) -> None:
        """The prompt ids' logprobs (the first None), sent with the first chunk; a score-only request
        (max_tokens 0) ends here."""
        self._prompt_logprobs = logprobs
        if self.request.max_tokens == 0:
            self._end("length")

    def accept(self, token: int, logprob: TokenLogprob | None = None) -> bool:
        """Record one chosen id and release what can be streamed; False once the request is done."""
        try:
            return self._push(token, logprob)
        except Exception as exc:  # noqa: BLE001 - e.g. the client is gone: this request fails, no other
            self.fail(exc)
            return False

    def _push(self, token: int, logprob: TokenLogprob | None) -> bool:
        self.generated.append(token)
        if len(self.generated) == 1:
            emit(self.request, "first_token")
        if token == self.eos:  # never streamed
            return self._end("eos")
        if self.wants_logprobs:
            self._held.append(logprob if logprob is not None else TokenLogprob(token, float("nan")))
        released = self.stream.push(token)
        if released:
            self.sink.send(released, **self._logprobs_of(len(released)))
        if self.stream.stopped:
            return self._end("stop")
        if len(self.generated) >= self.request.max_tokens:
            return self._end("length")
        return True

    def _logprobs_of(self, released: int) -> dict:
        """The sink's logprobs keyword for `released` ids (none for a request that did not ask)."""
        if not self.wants_logprobs:
            return {}
        taken, self._held = self._held[:released], self._held[released:]
        if self._prompt_logprobs is None:
            return {"logprobs": taken}
        prompt, self._prompt_logprobs = self._prompt_logprobs, None
        return {"logprobs": taken, "prompt_logprobs": prompt}

    def _end(self, reason: str) -> bool:
        self.ended = True
        last = self.stream.flush()
        self.sink.finish(reason, last, **self._logprobs_of(len(last)))
        emit(self.request, "finished", reason=reason, completion_tokens=self.completion_tokens)
        return False

    @property
    def completion_tokens(self) -> int:
        return len(self.generated) - (1 if self.generated and self.generated[-1] == self.eos else 0)

    def cancel(self) -> None:
        """An ordinary end (whoever stopped it reads the stream out), with nothing more to release."""
        self.ended = True
        try:
            self.sink.finish("cancelled", [], **self._logprobs_of(0))
        except Exception:  # noqa: BLE001 - the client is gone already; its row is freed all the same
            pass
        emit(self.request, "finished", reason="cancelled", completion_tokens=self.completion_tokens)

    def fail(self, error: BaseException) -> None:
        self.ended = True
        try:
            self.sink.fail(error)
        except Exception:  # noqa: BLE001 - a sink that cannot even fail must not stop the others
            _log.exception("could not report a failure to a codegen request")
        emit(self.request, "finished", error=repr(error), completion_tokens=self.completion_tokens)

    def gone(self, cancelled_keys: set[str], poll: bool) -> bool:
        """Whether the request was stopped by key, or (when polling) its client left; if so it is ended here."""
        try:
            left = poll and self.sink.cancelled()
        except Exception as exc:  # noqa: BLE001 - a sink that cannot tell fails its own request alone
            self.fail(exc)
            return True
        if (self.key is not None and self.key in cancelled_keys) or left:
            self.cancel()
            return True
        return False
