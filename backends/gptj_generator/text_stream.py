"""Decides, token by token, which generated ids may be streamed and when a stop word ends generation.

Ids are released in chunks whose bytes decode on their own to exactly the text they add: a chunk
never ends inside a multi-byte character that may still complete (held back until it does), nor
inside what may become a stop word. So the detokenized chunks concatenate to the detokenized whole,
and only the last chunk can contain a stop word (which the postprocessing cuts)."""
from __future__ import annotations

import codecs
from typing import Sequence


class TextStream:
    def __init__(self, token_bytes: Sequence[bytes], stop_words: Sequence[str] = (), skip_chars: int = 0):
        self.token_bytes = token_bytes
        self.skip_chars = skip_chars  # the text's first characters are no stop word's (token healing's prefix)
        self.stop_words = [w for w in stop_words if w]
        self.longest_stop = max((len(w) for w in self.stop_words), default=0)
        self.decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self.text = ""
        self.pending: list[tuple[int, int, bool]] = []  # (id, len(text) after it, decoder had no partial char)
        self.stopped = False

    def _bytes(self, token: int) -> bytes:
        return self.token_bytes[token] if 0 <= token < len(self.token_bytes) else b""

    def push(self, token: int) -> list[int]:
        """Add one generated id; return the ids that can be released now (all of them once stopped)."""
        searched_from = max(self.skip_chars, len(self.text) - self.longest_stop + 1)
        self.text += self.decoder.decode(self._bytes(token))
        clean = self.decoder.getstate()[0] == b""
        self.pending.append((token, len(self.text), clean))
        if self.stop_words and any(self.text.find(w, searched_from) >= 0 for w in self.stop_words):
            self.stopped = True
            return self.flush()
        limit = len(self.text) - self._stop_prefix_tail()
        release = 0
        for i, (_, end, boundary) in enumerate(self.pending):
            if end > limit:
                break
            if boundary:
                release = i + 1
        out = [t for t, _, _ in self.pending[:release]]
        del self.pending[:release]
        return out

    def flush(self) -> list[int]:
        out = [t for t, _, _ in self.pending]
        self.pending.clear()
        return out

    def _stop_prefix_tail(self) -> int:
        """Length of the longest end of the text that is the start of a stop word."""
        for n in range(min(self.longest_stop - 1, len(self.text) - self.skip_chars), 0, -1):
            tail = self.text[-n:]
            if any(w.startswith(tail) for w in self.stop_words):
                return n
        return 0
