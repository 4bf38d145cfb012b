"""Issue 42's fidelity: the OpenVINO engine's greedy fp32 tokens equal the torch reference's for 64 tokens, on the
trained demo model's held-out headers and on a GPT-J of codegen-350M-mono's shape (random weights), all requests
batched together; where a position differs, the reference's two top logits there must be within 1e-3 of each
other (a float tie), else the test fails. The chosen tokens' logprobs equal the reference's log_softmax (1e-4).
int8 weights are held to the demo's held-out parse share (within 0.05 of fp32), not to the tokens."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from build import codegen as codegen_build
from build import openvino_export
from build.train_codegen import function_headers, parses
from gptj_generator.loading import load_engine
from gptj_generator.seam import GenerationRequest
from codegen_common.token_bytes import token_bytes_table
from gptj_generator.torch_engine import TorchEngine
from test_codegen_engine import GENERATOR_DIR, Collector, reference, reference_model, tokenizer  # noqa: F401

NEW_TOKENS = 64
TIE = 1e-3  # top-2 logit gap under which two fp32 engines may choose differently
LOGPROB_TOLERANCE = 1e-4
SIZED_WAIT = 900  # the 350M shape's 64 steps on a loaded 2-core box (torch slows down most when cores are shared)
PARSE_SHARE_MARGIN = 0.05


def generate_together(engine, prompts: list[list[int]], logprobs: int | None = None,
                      timeout: float = 120) -> list[Collector]:
    """Every prompt submitted at once (one batch, up to the engine's rows), NEW_TOKENS greedy tokens each."""
    sinks = [Collector() for _ in prompts]
    for prompt, sink in zip(prompts, sinks):
        engine.submit(GenerationRequest(prompt, NEW_TOKENS, logprobs=logprobs), sink)
    for sink in sinks:
        assert sink.wait(timeout).error is None, sink.error
    return sinks


def first_difference(got: list[int], want: list[int]) -> int | None:
    for i, (a, b) in enumerate(zip(got, want)):
        if a != b:
            return i
    return None if len(got) == len(want) else min(len(got), len(want))  # one ended (end-of-text) early


@torch.inference_mode()
def logits_after(model, ids: list[int]) -> torch.Tensor:
    return model(torch.tensor([ids])).logits[0].float()


def assert_equal_or_tied(model, prompts, got, want) -> int:
    """Rows equal, or first differing where the reference's top-2 logits are within TIE; returns the ties."""
    ties = []
    for row, (prompt, g, w) in enumerate(zip(prompts, got, want)):
        i = first_difference(g, w)
        if i is None:
            continue
        top = torch.topk(logits_after(model, prompt + w[:i])[-1], 2).values
        gap = float(top[0] - top[1])
        assert gap < TIE, f"row {row} differs at token {i} ({g[i:i + 1]} vs {w[i:i + 1]}) with a top-2 gap of " \
                          f"{gap:.2e}: not a float tie"
        ties.append((row, i, gap))
    print(f"\n{len(prompts) - len(ties)}/{len(prompts)} rows equal; ties {ties}")
    return len(ties)


def max_logprob_error(model, prompts, rows) -> float:
    """Worst |engine logprob - reference log_softmax| over every generated token of every row."""
    worst = 0.0
    for prompt, sink in zip(prompts, rows):
        if not sink.ids:
            continue
        reference_lp = torch.log_softmax(logits_after(model, prompt + sink.ids), -1)
        for j, lp in enumerate(sink.logprobs):
            worst = max(worst, abs(lp.logprob - float(reference_lp[len(prompt) - 1 + j, lp.token_id])))
    return worst


def test_a_difference_that_is_no_float_tie_fails_the_check(tokenizer):
    """The check itself: equal rows pass; a row that differs where the reference's top-2 logits are far apart fails."""
    header = function_headers(1)[0]
    prompt, want = tokenizer(header)["input_ids"], reference(tokenizer, header, 16)
    assert assert_equal_or_tied(reference_model(), [prompt], [list(want)], [want]) == 0
    gaps = [torch.topk(logits_after(reference_model(), prompt + want[:i])[-1], 2).values for i in range(len(want))]
    i = next(i for i, top in enumerate(gaps) if float(top[0] - top[1]) > 10 * TIE)
    got = want[:i] + [(want[i] + 1) % len(tokenizer)] + want[i + 1:]
    with pytest.raises(AssertionError, match="not a float tie"):
        assert_equal_or_tied(reference_model(), [prompt], [got], [want])


@pytest.fixture(scope="module")
def openvino_demo():
    engine = load_engine("openvino", GENERATOR_DIR, 16, 512, precision="f32")  # the exact mode
    yield engine
    engine.close()


def test_demo_greedy_tokens_and_logprobs_equal_the_torch_reference(openvino_demo, tokenizer):
    headers = function_headers(16)
    prompts = [tokenizer(h)["input_ids"] for h in headers]
    rows = generate_together(openvino_demo, prompts, logprobs=0)
    want = [reference(tokenizer, h, NEW_TOKENS) for h in headers]
    assert_equal_or_tied(reference_model(), prompts, [r.ids for r in rows], want)
    worst = max_logprob_error(reference_model(), prompts, rows)
    print(f"chosen-token logprobs: worst error {worst:.1e}")
    assert worst < LOGPROB_TOLERANCE


@pytest.fixture(scope="module")
def sized(tmp_path_factory):
    """A GPT-J of codegen-350M-mono's shape as `CODEGEN_DEMO_SIZE=350m make model` builds it (random weights,
    the demo tokenizer), its fp32 IR (cached by build/openvino_export.py), and both engines over it."""
    folder = tmp_path_factory.mktemp("codegen_350m")
    tok = codegen_build.train_demo_tokenizer()
    model = codegen_build.demo_model(tok, "350m")
    model.save_pretrained(folder, safe_serialization=True)
    tok.save_pretrained(folder)
    openvino_export.export(folder, folder / openvino_export.IR_FOLDER, "fp32")
    torch.set_num_threads(1)
    engines = {"torch": TorchEngine(model, token_bytes_table(folder / "tokenizer.json"), model.config.eos_token_id,
                                    8, 512),
               "openvino": load_engine("openvino", folder, 8, 512, threads=1, precision="f32")}
    yield model, tok, engines
    for engine in engines.values():
        engine.close()


def test_350m_shape_greedy_tokens_equal_the_torch_engines(sized):
    model, tok, engines = sized
    rng = np.random.default_rng(42)
    prompts = [rng.integers(1, len(tok), 16).tolist() for _ in range(8)]  # 16-token prompts, no end-of-text
    want = [r.ids for r in generate_together(engines["torch"], prompts, timeout=SIZED_WAIT)]
    got = [r.ids for r in generate_together(engines["openvino"], prompts, timeout=SIZED_WAIT)]
    assert all(len(w) == NEW_TOKENS for w in want), "random weights: no end-of-text expected"
    assert_equal_or_tied(model, prompts, got, want)


def test_int8_weights_keep_the_demo_parse_share_within_005_of_fp32(openvino_demo, tokenizer, tmp_path):
    int8 = openvino_export.export(GENERATOR_DIR, tmp_path / "openvino-int8", "int8")
    engine = load_engine("openvino", GENERATOR_DIR, 16, 512, ir_dir=int8, precision="f32")
    try:
        assert engine.weights == "int8" and openvino_demo.weights == "fp32"
        headers = function_headers(50)
        prompts = [tokenizer(h)["input_ids"] for h in headers]
        shares = {}
        for name, eng in (("fp32", openvino_demo), ("int8", engine)):
            rows = generate_together(eng, prompts)
            texts = [h + tokenizer.decode(r.ids, skip_special_tokens=True) for h, r in zip(headers, rows)]
            shares[name] = sum(map(parses, texts)) / len(texts)
        print(f"\nheld-out parse share: fp32 {shares['fp32']:.2f}, int8 {shares['int8']:.2f}")
        assert abs(shares["int8"] - shares["fp32"]) <= PARSE_SHARE_MARGIN
    finally:
        engine.close()
