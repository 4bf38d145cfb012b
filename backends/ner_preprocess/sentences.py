"""flair 0.15.1's SegtokSentenceSplitter without flair or torch: a text -> its sentences, each tokenized
as `Sentence(sentence_text)` tokenizes it, token offsets mapped back to the caller's original string."""
from __future__ import annotations

from dataclasses import replace

from segtok.segmenter import split_multi

from ner_preprocess.flair_sentence import Token, tokenize


def split_sentences(text: str) -> list[tuple[int, str]]:
    """(offset in `text`, sentence text) per sentence, as SegtokSentenceSplitter._perform_split finds them."""
    out, offset = [], 0
    for sentence in split_multi(text):
        offset = text.index(sentence, offset)
        out.append((offset, sentence))
        offset += len(sentence)
    return out


def sentence_tokens(text: str) -> list[list[Token]]:
    """The tokens of each sentence that has any (flair's predict skips empty sentences), offsets into `text`."""
    out = []
    for offset, sentence in split_sentences(text):
        tokens = tokenize(sentence)
        if tokens:
            out.append([replace(t, start=t.start + offset, end=t.end + offset) for t in tokens])
    return out
