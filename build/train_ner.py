"""Train the demo NER tagger (flair SequenceTagger, ner-english-fast's architecture) on template
sentences of build/ner_corpus.py. The two character LMs stay as built (fixed random weights: training
them does not fit the build's time budget); the layers above them are trained: the re-projection,
the BiLSTM, the emission layer and the CRF transitions."""
from __future__ import annotations

from pathlib import Path

from build.common import TrainLog, seed_everything

SEED = 7
TRAIN_SEED, HELD_OUT_SEED = 21, 22  # sentence seeds: training set, held-out set
# Small batches: many more updates for the same arithmetic (measured: batch 32 learned 4x slower per epoch).
SENTENCES, EPOCHS, BATCH, LR = 800, 3, 8, 2e-3
LOCKED_DROPOUT = 0.1  # during training only (flair's default 0.5 slowed learning beyond the budget)
NAME = "ner-tagger"  # .artifacts/trained/<NAME>/
SOURCES = [Path(__file__), Path(__file__).with_name("ner_corpus.py"), Path(__file__).with_name("ner.py")]


def train(dest: Path, sentences: int = SENTENCES, epochs: int = EPOCHS) -> None:
    import torch

    from build import ner_corpus
    from build.ner import TAGGER_FILE, untrained_tagger

    tagger = untrained_tagger()
    seed_everything(SEED)
    data = [ner_corpus.flair_sentence(text, spans) for text, spans in ner_corpus.sentences("train", sentences, TRAIN_SEED)]
    trainable = [p for name, p in tagger.named_parameters() if not name.startswith("embeddings.")]
    for name, p in tagger.named_parameters():
        p.requires_grad_(not name.startswith("embeddings."))
    # The char LMs are fixed, so each sentence's embeddings are computed once and kept on its tokens.
    with torch.no_grad():
        for i in range(0, len(data), 64):
            tagger.embeddings.embed(data[i:i + 64])
    standardize_inputs(tagger, data)
    # fused: the square roots are torch's own, not MKL's vector math (build/instruction_set.py)
    optimizer = torch.optim.Adam(trainable, lr=LR, fused=True)
    batches = (len(data) + BATCH - 1) // BATCH
    log = TrainLog("ner tagger", epochs * batches)
    generator = torch.Generator().manual_seed(SEED)
    tagger.train()
    default_dropout = tagger.locked_dropout.dropout_rate
    tagger.locked_dropout.dropout_rate = LOCKED_DROPOUT
    for epoch in range(epochs):
        order = torch.randperm(len(data), generator=generator).tolist()
        for b in range(batches):
            loss, count = tagger.forward_loss([data[i] for i in order[b * BATCH:(b + 1) * BATCH]])
            optimizer.zero_grad()
            (loss / count).backward()
            torch.nn.utils.clip_grad_norm_(trainable, 5.0)
            optimizer.step()
            log.step(epoch * batches + b, (loss / count).item())
    tagger.locked_dropout.dropout_rate = default_dropout
    for sentence in data:
        sentence.clear_embeddings()
    for p in tagger.parameters():
        p.requires_grad_(True)
    tagger.eval()
    tagger.save(dest / TAGGER_FILE)


def standardize_inputs(tagger, data) -> None:
    """Start the re-projection layer on standardized char-LM features: its random weights divided by each
    feature's spread, its bias taking off their mean (the random LMs' features have large common
    offsets that otherwise slow the training down). Only the initial values change, not the layer."""
    import torch

    with torch.no_grad():
        features = torch.cat([torch.stack([token.get_embedding() for token in sentence]) for sentence in data])
        mean, spread = features.mean(0), features.std(0) + 1e-3
        weight = tagger.embedding2nn.weight / spread
        tagger.embedding2nn.bias.sub_(weight @ mean)
        tagger.embedding2nn.weight.copy_(weight)


def predicted_spans(tagger, texts: list[str]) -> list[set[tuple[int, int, str]]]:
    from flair.data import Sentence

    sentences = [Sentence(t) for t in texts]
    tagger.predict(sentences, mini_batch_size=32)
    return [{(s.start_position, s.end_position, s.tag) for s in sentence.get_spans("ner")} for sentence in sentences]


def span_f1(tagger, count: int = 200, seed: int = HELD_OUT_SEED) -> dict[str, float]:
    """Exact-span micro F1 on held-out templates filled with held-out names, overall and per type."""
    from build.ner_corpus import ENTITY_TYPES, sentences

    held_out = sentences("held_out", count, seed)
    predicted = predicted_spans(tagger, [text for text, _ in held_out])
    scores = {}
    for kind in (None,) + ENTITY_TYPES:
        tp = fp = fn = 0
        for (_, gold), pred in zip(held_out, predicted):
            g = {s for s in gold if kind in (None, s[2])}
            p = {s for s in pred if kind in (None, s[2])}
            tp, fp, fn = tp + len(g & p), fp + len(p - g), fn + len(g - p)
        scores[kind or "all"] = 2 * tp / max(1, 2 * tp + fp + fn)
    return scores
