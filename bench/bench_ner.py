"""ner: served sentences/s at concurrency 1, 8, 32, 64 against the in-process limit of the best path: flair's
own SequenceTagger.predict (mini_batch_size=64) or the stages' code called directly (ONNX Runtime or torch
tagger, 1 or 2 threads), on the same sentences and the same saved model."""
from __future__ import annotations

import itertools
import random
import time

from bench import stats
from bench.model_repo import MODEL_REPOSITORY, parameter
from bench.perf import best_limit, in_process_limit, run_load, text_inputs_factory

PEOPLE = ["George Washington", "Angela Merkel", "Barack Obama", "Marie Curie", "Kofi Annan", "Zoë Saldaña"]
PLACES = ["Washington", "Berlin", "Paris", "New York", "Tokyo", "Zürich", "the United Kingdom", "Lagos"]
ORGS = ["the United Nations", "Microsoft", "Siemens AG", "the European Union", "NASA", "Real Madrid"]
TEMPLATES = [
    "{p} went to {l} last {d}.", "{o} opened a new office in {l}.", "{p} met {q} at the {o} summit in {l}.",
    "According to {o}, {p} will visit {l} and {m} on {d}.", "In {l}, {p} said that {o} had agreed.",
    "{p} and {q} worked for {o} before moving from {l} to {m} in the spring of that year.",
]
DAYS = ["Monday", "Tuesday", "week", "year", "Friday"]


def corpus(n: int = 512, seed: int = 0) -> list[str]:
    """News-like sentences of 5 to 30 words, identical on every run."""
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        sentences = [rng.choice(TEMPLATES).format(p=rng.choice(PEOPLE), q=rng.choice(PEOPLE), l=rng.choice(PLACES),
                                                  m=rng.choice(PLACES), o=rng.choice(ORGS), d=rng.choice(DAYS))
                     for _ in range(rng.choice((1, 1, 1, 2)))]
        out.append(" ".join(sentences))
    return out


def flair_predict():
    """flair's own Sentence(text) + SequenceTagger.predict(mini_batch_size=64): the limit."""
    from flair.data import Sentence
    from flair.models import SequenceTagger

    from build.ner import FLAIR_TAGGER

    tagger = SequenceTagger.load(FLAIR_TAGGER).eval()
    return lambda texts: tagger.predict([Sentence(t) for t in texts], mini_batch_size=64)


def stage_code(runtime: str = "onnx", threads: int = 2):
    """preprocess -> tagger -> decoder as the served stages run them, each text a request of its own."""
    from ner_decoder.decoding import NerDecoder
    from ner_preprocess.preprocessing import NerPreprocessor
    from ner_tagger.rows import sentence_rows
    from ner_tagger.runtimes import make_tagger

    preprocessor = NerPreprocessor(MODEL_REPOSITORY / "ner_preprocess" / "1" / "char_lm.json")
    tagger = make_tagger(MODEL_REPOSITORY / "ner_tagger" / "1", runtime, threads)
    decoder = NerDecoder(MODEL_REPOSITORY / "ner_decoder" / "1" / "crf.json")
    chars_per_forward = int(parameter("ner_tagger", "chars_per_forward"))
    names = ("char_ids", "sentence_chars", "sentence_tokens", "token_positions", "token_count")

    def process(texts: list[str]) -> None:
        encoded = [preprocessor.encode([text]) for text in texts]
        rows = [sentence_rows(*(e[k] for k in names)) for e in encoded]
        for text, e, emissions in zip(texts, encoded, tagger.emissions_per_request(rows, chars_per_forward)):
            decoder.decode([text], emissions, e["token_offsets"], e["sentence_tokens"], e["token_count"])

    return process


def limit(seconds: float) -> float:
    """The best in-process path, sentences/s: flair predict (it sorts each 256-sentence chunk by length
    before cutting mini-batches of 64) or the stages' code at batch 64."""
    flair, _, _ = in_process_limit(flair_predict(), corpus(), (256,), seconds, "sentences/sec (flair predict)")
    return max(flair, best_limit(stage_code, corpus(), (64,), seconds, "sentences/sec"))


# Two char LMs of hidden 1024 run one step per character: a batch of 32 sentences takes seconds on a
# 2-core CPU, so a few-second window would hold only a handful of batches.
MIN_WINDOW, MIN_WARMUP = 30.0, 10.0


def one_text_latencies(predict, texts: list[str], seconds: float) -> list[float]:
    """flair predict of one text at a time, in-process: what a single user of the peer would wait."""
    out: list[float] = []
    end = time.perf_counter() + seconds
    for text in itertools.cycle(texts):
        if time.perf_counter() >= end:
            return out
        start = time.perf_counter()
        predict([text])
        out.append(time.perf_counter() - start)


def run(ctx) -> None:
    texts = corpus()
    window = ctx.window if ctx.quick else max(ctx.window, MIN_WINDOW)
    warmup = ctx.warmup if ctx.quick else max(ctx.warmup, MIN_WARMUP)
    best = limit(window / 4)
    alone = stats.median(one_text_latencies(flair_predict(), texts, window / 2))
    for concurrency in ((1, 32) if ctx.quick else (1, 8, 32, 64)):
        result = run_load(ctx.grpc_url, "ner", text_inputs_factory(texts), concurrency, window, warmup)
        ctx.report(result, best, "sentences/sec")
        if concurrency == 1:
            ratio = result.percentile(50) / alone
            print(f"goal ner p50 at concurrency 1 / flair predict of one text in-process <= 1.5: "
                  f"{result.percentile(50) * 1e3:.1f} / {alone * 1e3:.1f} ms = {ratio:.2f} "
                  f"{'OK' if ratio <= 1.5 else 'MISSED'}", flush=True)
