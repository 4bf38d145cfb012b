"""A Hugging Face fast tokenizer (tokenizer.json) driven the way sentence-transformers drives it."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
from tokenizers import Encoding, Tokenizer

# Pre-tokenizers that always split at a space, so the words before a space never depend on what follows
# (ByteLevel or Metaspace glue the space to the next word: there a prefix could end differently).
_SPLIT_AT_SPACE = {"BertPreTokenizer", "Whitespace", "WhitespaceSplit"}


def _pad_token(folder: Path) -> str:
    """The pad token the model's own files name (CLIP pads with <|endoftext|>), else BERT's [PAD]."""
    for name in ("special_tokens_map.json", "tokenizer_config.json"):
        try:
            pad = json.loads((folder / name).read_text(encoding="utf-8")).get("pad_token")
        except (OSError, ValueError):
            continue
        pad = pad.get("content") if isinstance(pad, dict) else pad
        if isinstance(pad, str) and pad:
            return pad
    return "[PAD]"


class TextTokenizer:
    def __init__(self, tokenizer_file: Path, max_length: int, prefix_chars: int | None = None):
        self.tokenizer = Tokenizer.from_file(str(tokenizer_file))
        self.tokenizer.no_padding()  # tokenizer.json may carry fixed padding; we pad per request
        self.tokenizer.enable_truncation(max_length=max_length)
        self.max_length = max_length
        pad = self.tokenizer.token_to_id(_pad_token(Path(tokenizer_file).parent))
        self.pad_id = 0 if pad is None else pad  # masked out either way: only the ids' look differs
        pre = (json.loads(Path(tokenizer_file).read_text(encoding="utf-8")).get("pre_tokenizer") or {}).get("type")
        # Long texts are tokenized from a prefix first: 16 characters per token covers any ordinary text
        self.prefix_chars = (prefix_chars or 16 * max_length) if pre in _SPLIT_AT_SPACE else None

    def _pad(self, encodings: list[Encoding]) -> tuple[np.ndarray, np.ndarray]:
        longest = max((len(e.ids) for e in encodings), default=0)
        ids = np.full((len(encodings), longest), self.pad_id, dtype=np.int64)
        mask = np.zeros((len(encodings), longest), dtype=np.int64)
        for row, enc in enumerate(encodings):
            ids[row, : len(enc.ids)] = enc.ids
            mask[row, : len(enc.ids)] = 1
        return ids, mask

    def _truncated(self, texts: list[str]) -> list[Encoding]:
        """encode_batch(texts) truncated to max_length, without tokenizing all of a long text: a text is
        first tokenized up to a space near `prefix_chars`. The words before that space give the same
        tokens as in the whole text, so if they already fill max_length, the result is the whole text's.
        Otherwise the prefix doubles, up to the whole text."""
        out: list[Encoding | None] = [None] * len(texts)
        pending = list(range(len(texts)))
        limit = self.prefix_chars
        while pending:
            inputs, exact = [], []
            for i in pending:
                cut = texts[i].rfind(" ", limit // 2, limit) if limit and len(texts[i]) > limit else -1
                inputs.append(texts[i] if cut < 0 else texts[i][:cut + 1])
                exact.append(cut < 0)
            retry = []
            for i, is_whole, enc in zip(pending, exact, self.tokenizer.encode_batch(inputs)):
                if is_whole or len(enc.ids) >= self.max_length:
                    out[i] = enc
                else:
                    retry.append(i)
            pending, limit = retry, (limit or 0) * 2
        return out

    def encode_per_request(self, requests: list[list[str]]) -> list[tuple[np.ndarray, np.ndarray]]:
        """input_ids and attention_mask per request, right-padded to that request's longest row.
        One tokenizer call covers every row; texts are stripped first, as sentence-transformers does."""
        encodings = self._truncated([t.strip() for texts in requests for t in texts])
        out, start = [], 0
        for texts in requests:
            out.append(self._pad(encodings[start:start + len(texts)]))
            start += len(texts)
        return out

    def encode(self, texts: list[str]) -> tuple[np.ndarray, np.ndarray]:
        return self.encode_per_request([texts])[0]
