"""bench/codegen_limits.py's arithmetic without a model or a server: the bytes a decode step reads (every weight but
the token embedding's) and each request's decode rate (tokens after its first over their time)."""
from __future__ import annotations

import numpy as np
from safetensors.numpy import save_file

from bench.bench_codegen_engines import Trace
from bench.codegen_limits import decode_rates, weights_read_per_token


def test_bytes_read_per_token_leave_out_the_token_embedding(tmp_path):
    save_file({"transformer.wte.weight": np.zeros((100, 8), np.float32),  # one row gathered per token
               "transformer.h.0.attn.q_proj.weight": np.zeros((8, 8), np.float32),
               "lm_head.weight": np.zeros((100, 8), np.float32), "lm_head.bias": np.zeros(100, np.float32)},
              str(tmp_path / "model.safetensors"))
    assert weights_read_per_token(tmp_path) == 64 + 800 + 100


def test_decode_rates_count_the_tokens_after_the_first_over_their_time():
    streamed = Trace(0.0, [(0.5, 1), (1.0, 3), (1.5, 5)])  # first token at 0.5 s (prefill), then 4 in 1 s
    single = Trace(0.0, [(0.4, 8)])  # one response: no decode time to measure
    assert decode_rates([streamed, single]) == [4.0]
