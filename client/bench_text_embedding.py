"""text_embedding: served sentences/s at concurrency 1, 8, 32, 64 vs the same stage code in-process."""
from __future__ import annotations

import os
import random
import time

from perf import run_load, text_inputs_factory
from tools.model_repo import MODEL_REPOSITORY, parameter

WORDS = ("the a model server request batch token sentence embedding vector latency throughput queue "
         "worker python triton tensor inference pipeline stage encoder network memory cache shared "
         "quickly slowly returns computes sends receives every each small large").split()


def corpus(n: int = 512, seed: int = 0) -> list[str]:
    """Sentences of 6 to 40 words: a spread of lengths like real traffic, identical on every run."""
    rng = random.Random(seed)
    return [" ".join(rng.choice(WORDS) for _ in range(rng.randint(6, 40))).capitalize() + "." for _ in range(n)]


def in_process_limit(texts: list[str], seconds: float) -> tuple[float, int]:
    """Best sentences/s of the tokenizer -> encoder -> pooling stage code called directly, one
    sentence per request as the served load sends them, over batch sizes, with every core."""
    import torch
    from mean_pooling.pooling import mean_pool_normalize
    from text_tokenizer.tokenization import TextTokenizer
    from transformer_encoder.encoder import TransformerEncoder

    torch.set_num_threads(os.cpu_count() or 1)
    tokenizer = TextTokenizer(MODEL_REPOSITORY / "text_embedding_tokenizer" / "1" / "tokenizer.json",
                              int(parameter("text_embedding_tokenizer", "max_length")))
    encoder = TransformerEncoder(MODEL_REPOSITORY / "text_embedding_encoder" / "1", torch.device("cpu"),
                                 int(parameter("text_embedding_encoder", "rows_per_forward", "8")))
    best = (0.0, 0)
    for batch in (8, 16, 32, 64):
        done, start, i = 0, time.perf_counter(), 0
        while time.perf_counter() - start < seconds:
            requests = [[texts[(i + k) % len(texts)]] for k in range(batch)]
            i += batch
            encoded = tokenizer.encode_per_request(requests)
            for (_, mask), hidden in zip(encoded, encoder.encode_per_request(encoded)):
                mean_pool_normalize(hidden, mask)
            done += batch
        rate = done / (time.perf_counter() - start)
        print(f"  limit, in-process batch {batch}: {rate:.1f} sentences/sec")
        best = max(best, (rate, batch))
    return best


def run(ctx) -> None:
    texts = corpus()
    limit, batch = in_process_limit(texts, max(ctx.window / 2, 1.0))
    print(f"Limit: {limit:.1f} sentences/sec (in-process, batch {batch})\n")
    for concurrency in ((1, 32) if ctx.quick else (1, 8, 32, 64)):
        result = run_load(ctx.grpc_url, "text_embedding", text_inputs_factory(texts), concurrency,
                          ctx.window, ctx.warmup)
        ctx.report(result, limit, "sentences/sec")
