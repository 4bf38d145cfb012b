"""text_embedding: served sentences/s at concurrency 1, 8, 32, 64 vs the same stage code in-process."""
from __future__ import annotations

import random

from bench.model_repo import MODEL_REPOSITORY, parameter
from bench.perf import best_limit, run_load, text_inputs_factory

WORDS = ("the a model server request batch token sentence embedding vector latency throughput queue "
         "worker python triton tensor inference pipeline stage encoder network memory cache shared "
         "quickly slowly returns computes sends receives every each small large").split()


def corpus(n: int = 512, seed: int = 0) -> list[str]:
    """Sentences of 6 to 40 words: a spread of lengths like real traffic, identical on every run."""
    rng = random.Random(seed)
    return [" ".join(rng.choice(WORDS) for _ in range(rng.randint(6, 40))).capitalize() + "." for _ in range(n)]


def stage_code(runtime: str = "onnx", threads: int = 1):
    """tokenizer -> encoder -> pooling as the served stages run them, one sentence per request."""
    from mean_pooling.pooling import mean_pool_normalize
    from text_tokenizer.tokenization import TextTokenizer
    from transformer_encoder.encoder import make_encoder

    tokenizer = TextTokenizer(MODEL_REPOSITORY / "text_embedding_tokenizer" / "1" / "tokenizer.json",
                              int(parameter("text_embedding_tokenizer", "max_length")))
    encoder = make_encoder(MODEL_REPOSITORY / "text_embedding_encoder" / "1", runtime, threads,
                           int(parameter("text_embedding_encoder", "rows_per_forward", "8")))

    def process(texts: list[str]) -> None:
        encoded = tokenizer.encode_per_request([[t] for t in texts])
        for (_, mask), hidden in zip(encoded, encoder.encode_per_request(encoded)):
            mean_pool_normalize(hidden, mask)

    return process


def limit(seconds: float, batch_sizes: tuple[int, ...] = (1, 8, 32, 64)) -> float:
    """The best in-process path, sentences/s."""
    return best_limit(stage_code, corpus(), batch_sizes, seconds, "sentences/sec")


def run(ctx) -> None:
    texts = corpus()
    best = limit(max(ctx.window / 4, 1.0))
    for concurrency in ((1, 32) if ctx.quick else (1, 8, 32, 64)):
        result = run_load(ctx.grpc_url, "text_embedding", text_inputs_factory(texts), concurrency,
                          ctx.window, ctx.warmup)
        ctx.report(result, best, "sentences/sec")
