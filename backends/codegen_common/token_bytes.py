"""The raw bytes behind every token id of a byte-level BPE tokenizer (tokenizer.json).

The generator needs bytes, not text: a multi-byte character split across tokens has no text of
its own until its last byte arrives (gptj_generator/text_stream.py); the fronts spell a token's logprob
entry from the same bytes (completion_text.py), so the table is defined here, where both can import it."""
from __future__ import annotations

from pathlib import Path

from tokenizers import Tokenizer


def _byte_level_alphabet() -> dict[str, int]:
    """GPT-2's printable stand-in character for each byte (what ByteLevel vocabularies are written in)."""
    printable = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + \
        list(range(ord("®"), ord("ÿ") + 1))
    chars, extra = {}, 0
    for b in range(256):
        if b in printable:
            chars[chr(b)] = b
        else:
            chars[chr(256 + extra)] = b
            extra += 1
    return chars


def token_bytes_table(tokenizer_file: Path) -> list[bytes]:
    """bytes per id, as the ByteLevel decoder maps them: special tokens decode to nothing (they are
    skipped), and a token holding a character outside the byte alphabet (an added token such as a run
    of real spaces) stands for its own UTF-8 bytes."""
    tokenizer = Tokenizer.from_file(str(tokenizer_file))
    alphabet = _byte_level_alphabet()
    special = {i for i, t in tokenizer.get_added_tokens_decoder().items() if t.special}
    table = [b""] * tokenizer.get_vocab_size(with_added_tokens=True)
    for token, i in tokenizer.get_vocab(with_added_tokens=True).items():
        if i in special:
            continue
        if all(c in alphabet for c in token):
            table[i] = bytes(alphabet[c] for c in token)
        else:
            table[i] = token.encode("utf-8")
    return table
