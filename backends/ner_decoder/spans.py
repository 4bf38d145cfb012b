"""BIOES tags -> entity spans, exactly as flair.data.get_spans_from_bio, then the JSON entities."""
from __future__ import annotations

import json


def spans_from_bioes(tags: list[str], scores: list[float]) -> list[tuple[list[int], float, str]]:
    """(token indices, score = mean token confidence, label = the most weighted class) per span.
    A port of flair.data.get_spans_from_bio, quirks included."""
    found = []
    weights: dict[str, float] = {}
    previous = "O-"
    span: list[int] = []
    span_scores: list[float] = []
    for idx, tag in enumerate(list(tags) + ["O"]):  # a dummy "O" closes the last span
        if tag in ("", "O", "_"):
            tag = "O-"
        in_span = tag != "O-"
        starts_new = tag[:2] in {"B-", "S-"} or (
            in_span and previous[2:] != tag[2:] and (tag[:2] == "I-" or previous[2:] == "S-"))
        if (starts_new or not in_span) and span:
            found.append((span, sum(span_scores) / len(span_scores), max(weights.keys(), key=weights.__getitem__)))
            span, span_scores, weights = [], [], {}
        if in_span:
            span.append(idx)
            span_scores.append(scores[idx] if scores else 1.0)
            weights[tag[2:]] = weights.setdefault(tag[2:], 0.0) + (1.1 if starts_new else 1.0)
        previous = tag
    return found


def entities_json(text: str, offsets, spans: list[tuple[list[int], float, str]]) -> str:
    """offsets[k] = (start, end) of token k in `text`, the request's original string."""
    entities = []
    for tokens, score, label in spans:
        start, end = int(offsets[tokens[0]][0]), int(offsets[tokens[-1]][1])
        entities.append({"text": text[start:end], "label": label, "start": start, "end": end, "score": score})
    entities.sort(key=lambda e: e["start"])
    return json.dumps(entities, ensure_ascii=False)
