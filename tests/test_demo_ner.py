"""The demo NER tagger that `make model` trains (build/train_ner.py) finds entities in sentences of
templates and names it never saw (build/ner_corpus.py's held-out parts)."""
from __future__ import annotations

import pytest

from build.ner import FLAIR_TAGGER
from build.ner_corpus import HELD_OUT_TEMPLATES, TEMPLATES, NameSource

HELD_OUT_F1_MIN = 0.6  # measured figure in docs/demo-models.md


@pytest.fixture(scope="module")
def tagger():
    import torch
    from flair.models import SequenceTagger

    torch.set_num_threads(1)
    return SequenceTagger.load(FLAIR_TAGGER).eval()


def test_held_out_parts_are_disjoint_from_training():
    train, held = NameSource("train"), NameSource("held_out")
    for key in train.pools:
        assert train.pools[key] and held.pools[key], key
        assert not set(train.pools[key]) & set(held.pools[key]), key
    assert 0 < len(HELD_OUT_TEMPLATES) < len(TEMPLATES)


def test_span_f1_on_held_out_templates_and_names(tagger):
    from build.train_ner import span_f1

    scores = span_f1(tagger, count=200)
    print("held-out span F1", scores)
    assert scores["all"] >= HELD_OUT_F1_MIN, scores
    assert min(scores[t] for t in ("PER", "LOC", "ORG")) >= 0.4, scores


def test_george_washington_went_to_washington(tagger):
    from build.train_ner import predicted_spans

    text = "George Washington went to Washington."
    (spans,) = predicted_spans(tagger, [text])
    assert sorted((text[a:b], tag) for a, b, tag in spans) == [("George Washington", "PER"), ("Washington", "LOC")]
