"""One sequence's answer as its client sees it, piece by piece (codegen_stream's front, codegen_postprocess): the
generated ids decoded, token healing's backed-off text cut from the start (the answer starts right after the
user's prompt), cut before the first stop word, and, for requests with logprobs, each piece's OpenAI legacy
completions `logprobs` object (tokens, token_logprobs, top_logprobs, text_offset) built from the generator's
`logprobs` output (logprobs_wire.py). Torch-free.

text_offset counts characters from the start of the piece's text (the echoed prompt included); a client joining
pieces adds the length of the text before each piece. A healed first token starts before the answer: its offset is
negative (-len of the backed-off text), its token string the whole token."""
from __future__ import annotations

import codecs
import json
from typing import Sequence

import numpy as np

from codegen_common import logprobs_wire
from codegen_common.detokenizer import Detokenizer, cut_at_stop_words
from codegen_common.generation_params import GenerationParams
from codegen_common.token_bytes import token_bytes_table


def token_string(raw: bytes) -> str:
    """A token's text, or OpenAI's "bytes:\\xNN..." form for a token that is not whole UTF-8 characters."""
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        return "bytes:" + "".join(f"\\x{b:02x}" for b in raw)


class LogprobsObject:
    """Accumulates OpenAI's legacy logprobs object."""

    def __init__(self, token_bytes: Sequence[bytes]):
        self.token_bytes = token_bytes
        self.tokens: list[str] = []
        self.token_logprobs: list[float | None] = []
        self.top_logprobs: list[dict | None] = []
        self.text_offset: list[int] = []

    def add(self, ids: Sequence[int], entries: list, start: int) -> int:
        """ids with their wire entries, the first starting at character `start`; returns the offset after them."""
        decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        at = start
        for token, entry in zip(ids, entries):
            raw = self.token_bytes[token] if 0 <= token < len(self.token_bytes) else b""
            name = token_string(raw)
            self.tokens.append(name)
            self.text_offset.append(at)
            at += len(decoder.decode(raw))
            if entry is None:
                self.token_logprobs.append(None)
                self.top_logprobs.append(None)
                continue
            logprob, top = entry
            self.token_logprobs.append(logprob)
            alternatives = {token_string(self.token_bytes[t]): lp for t, lp in top}
            alternatives.setdefault(name, logprob)  # OpenAI: the k most likely and the chosen one
            self.top_logprobs.append(alternatives)
        return at

    def keep_before(self, end: int) -> None:
        """Drop the tokens that start at or after `end` (cut by a stop word)."""
        keep = sum(1 for offset in self.text_offset if offset < end)
        for values in (self.tokens, self.token_logprobs, self.top_logprobs, self.text_offset):
            del values[keep:]

    def as_dict(self) -> dict:
        return {"tokens": self.tokens, "token_logprobs": self.token_logprobs, "top_logprobs": self.top_logprobs,
                "text_offset": self.text_offset}


class CompletionText:
    def __init__(self, detokenizer: Detokenizer, token_bytes: Sequence[bytes], params: GenerationParams,
                 prompt_ids: Sequence[int] = ()):
        self.detokenizer, self.token_bytes, self.params = detokenizer, token_bytes, params
        self.prompt_ids = list(prompt_ids)
        self.to_cut = len(params.heal_prefix)  # characters of healed prefix not yet cut

    def piece(self, ids: Sequence[int], logprobs: str | bytes = "", prefix: str = "") -> tuple[str, str]:
        """(text, logprobs JSON or "") of one piece of generated ids; `prefix` (the echoed prompt) goes first."""
        text = self.detokenizer.decode([(np.asarray(ids, dtype=np.int64), [])])[0]
        if isinstance(text, Exception):
            raise text
        cut = min(self.to_cut, len(text))
        self.to_cut -= cut
        whole = text[cut:]
        text = prefix + cut_at_stop_words(whole, self.params.stop)
        if self.params.logprobs is None:
            return text, ""
        entries, prompt_entries = logprobs_wire.decode(logprobs)
        found = LogprobsObject(self.token_bytes)
        if prompt_entries is not None:
            found.add(self.prompt_ids, prompt_entries, 0)
        found.add(ids, entries, len(prefix) - cut)
        if len(text) < len(prefix) + len(whole):  # a stop word cut the text
            found.keep_before(len(text))
        return text, json.dumps(found.as_dict(), separators=(",", ":"))


class CompletionTexts:
    """A front's tokenizer, and a CompletionText per sequence."""

    def __init__(self, tokenizer_file):
        self.detokenizer = Detokenizer(tokenizer_file)
        self.token_bytes = token_bytes_table(tokenizer_file)

    def spelled(self, ids: Sequence[int]) -> str:
        """The text of ids (a token-id prompt, echoed) as LogprobsObject counts offsets in it: each id's bytes,
        undecodable ones replaced."""
        table = self.token_bytes
        return b"".join(table[i] if 0 <= i < len(table) else b"" for i in map(int, ids)).decode("utf-8", "replace")

    def start(self, params: GenerationParams, prompt_ids: Sequence[int] = ()) -> CompletionText:
        return CompletionText(self.detokenizer, self.token_bytes, params, [int(i) for i in prompt_ids])
