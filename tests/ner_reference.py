"""What the ner pipeline must equal: flair's SegtokSentenceSplitter on each text, then
SequenceTagger.predict on those sentences, spans mapped back to offsets into the original string."""
from __future__ import annotations

from ner_preprocess.flair_sentence import clean_text


def flair_entities(tagger, texts: list[str], mini_batch_size: int = 32) -> list[list[tuple]]:
    """(start, end, label, score) per entity of each text, in order of start."""
    from flair.splitter import SegtokSentenceSplitter

    splitter = SegtokSentenceSplitter()
    per_text = [splitter.split(t) for t in texts]
    tagger.predict([s for sentences in per_text for s in sentences if len(s)], mini_batch_size=mini_batch_size)
    out = []
    for text, sentences in zip(texts, per_text):
        spans = []
        for sentence in sentences:
            # flair's span offsets are into the sentence's cleaned text (the clean-up is character by
            # character, so cleaning the rest of the text maps them too); offsets into the original string
            _, origin = clean_text(text[sentence.start_position:])
            spans += [(sentence.start_position + origin[s.start_position],
                       sentence.start_position + origin[s.end_position - 1] + 1, s.tag, s.score)
                      for s in sentence.get_spans("ner")]
        out.append(sorted(spans, key=lambda span: span[0]))
    return out
