"""flair 0.15.1's `Sentence(text)` tokenization (segtok), without flair or torch, keeping every token's
character offsets both in flair's cleaned text and in the caller's original string."""
from __future__ import annotations

from dataclasses import dataclass

from segtok.segmenter import split_single
from segtok.tokenizer import split_contractions, word_tokenizer

# Sentence._handle_problem_characters: these are deleted ...
_ZERO_WIDTH = frozenset("\u200c\u200b\ufe0f\ufeff\u2028\u2029")


def _windows_1252(ch: str) -> str:
    # ... and U+0080..U+0099 become the windows-1252 character of that byte (deleted when it has none)
    try:
        return bytes([ord(ch)]).decode("windows-1252")
    except UnicodeDecodeError:
        return ""


@dataclass(frozen=True)
class Token:
    text: str  # as flair sees it (after the problem-character clean-up)
    whitespace_after: int
    start: int  # offsets into the ORIGINAL string: original[start:end] is the token's source
    end: int


def clean_text(text: str) -> tuple[str, list[int]]:
    """flair's cleaned text, and for each of its characters the index of the original one it came from."""
    kept, origin = [], []
    for i, ch in enumerate(text):
        if ch in _ZERO_WIDTH:
            continue
        if "\u0080" <= ch <= "\u0099":
            ch = _windows_1252(ch)
            if not ch:
                continue
        kept.append(ch)
        origin.append(i)
    return "".join(kept), origin


def segtok_words(text: str) -> list[str]:
    """flair.tokenization.SegtokTokenizer.run_tokenize."""
    words: list[str] = []
    for sentence in split_single(text):
        words.extend(split_contractions(word_tokenizer(sentence)))
    return [w for w in words if w]


def tokenize(text: str) -> list[Token]:
    """The tokens of flair's `Sentence(text)`, positioned as flair positions them (str.index from the end
    of the previous token), with their offsets mapped back to `text`."""
    cleaned, origin = clean_text(text)
    positions: list[tuple[str, int]] = []
    offset = 0
    for word in segtok_words(cleaned):
        start = cleaned.index(word, offset)
        positions.append((word, start))
        offset = start + len(word)
    tokens = []
    for k, (word, start) in enumerate(positions):
        end = start + len(word)
        whitespace = positions[k + 1][1] - end if k + 1 < len(positions) else 0
        tokens.append(Token(word, whitespace, origin[start], origin[end - 1] + 1))
    return tokens
