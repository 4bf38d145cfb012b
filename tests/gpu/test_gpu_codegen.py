"""The codegen generator's torch engine (the engine for CUDA instances) on cuda:0 against the same engine on the
CPU: greedy tokens equal for prompts decoded together, or parted once at a near tie on the CPU's logits
(gpu_helpers.check_rows: teacher forced on the CPU's tokens, at most one row in eight). The GPU engine's model
is on cuda:0 and the GPU's allocator works while it decodes. Kept small: the import names below follow
backends/gptj_generator/ (its engine seam)."""
from __future__ import annotations

import threading

from gpu_helpers import CUDA, GPU_TIER, Row, assert_on_gpu, check_rows, gpu_memory_grows, model_dir

pytestmark = GPU_TIER

PROMPTS = ["def fibonacci(n):", "import os\n", "x", "class Stack:\n    def __init__(self):\n        self.items = []\n",
           "for i in range(10):\n    print(i)  # a longer prompt than the others, to make the batch ragged",
           "def add(a, b):\n    return", "# sort a list of numbers\n", "with open('data.txt') as f:\n"]  # 8 rows:
# check_rows allows a near tie in one row in eight
MAX_TOKENS = 32


class Tokens:
    """A sink that keeps a request's ids."""

    def __init__(self):
        self.ids: list[int] = []
        self.error = None
        self.done = threading.Event()

    def send(self, token_ids, logprobs=None):
        self.ids += list(token_ids)

    def finish(self, reason, token_ids, logprobs=None):
        self.ids += list(token_ids)
        self.done.set()

    def fail(self, error):
        self.error = error
        self.done.set()

    def cancelled(self):
        return False


def greedy(device, folder, prompts: list[list[int]]) -> list[list[int]]:
    from gptj_generator.loading import load_torch_engine
    from gptj_generator.seam import GenerationRequest, SamplingParams

    engine = load_torch_engine(folder, max_batch_size=8, max_tokens_limit=512, device=device)
    try:
        def decode():
            sinks = [Tokens() for _ in prompts]
            for ids, sink in zip(prompts, sinks):  # submitted together: decoded in one batch
                engine.submit(GenerationRequest(ids, MAX_TOKENS, SamplingParams(temperature=0.0)), sink)
            for sink in sinks:
                assert sink.done.wait(300) and sink.error is None, sink.error
            return [sink.ids for sink in sinks]

        if device == "cpu":
            return decode()
        assert engine.device == CUDA, engine.device
        assert_on_gpu("codegen torch engine", engine)
        return gpu_memory_grows("codegen torch engine", decode)
    finally:
        engine.close()


def test_greedy_codegen_tokens_on_cuda_equal_cpu():
    import torch
    from tokenizers import Tokenizer
    from transformers import GPTJForCausalLM

    folder = model_dir("codegen_generator", "config.json", "model.safetensors", "tokenizer.json")
    tokenizer = Tokenizer.from_file(str(folder / "tokenizer.json"))
    prompts = [tokenizer.encode(p).ids for p in PROMPTS]
    cpu, gpu = greedy("cpu", folder, prompts), greedy(CUDA, folder, prompts)
    models = {}

    def logits_at(prompt: list[int], generated: list[int]):
        """Both devices' next-token logits after prompt + generated[:position], from one forward per device
        over the whole row (the logits at every position come out of it)."""
        rows = {}

        def at(position: int):
            if not rows:
                for device in ("cpu", CUDA):
                    if device not in models:
                        models[device] = GPTJForCausalLM.from_pretrained(str(folder), dtype=torch.float32).to(
                            device).eval()
                    with torch.inference_mode():
                        logits = models[device](torch.tensor([prompt + generated], device=device)).logits[0]
                    rows[device] = logits.float().cpu().numpy()
            return tuple(rows[device][len(prompt) - 1 + position] for device in ("cpu", CUDA))
        return at

    assert sum(map(len, cpu)) > len(PROMPTS), "the demo model wrote (almost) nothing"  # a row may end at once
    check_rows([Row(f"codegen {text[:20]!r}", c, g, logits_at(prompt, c))
                for text, prompt, c, g in zip(PROMPTS, prompts, cpu, gpu)],
               end_token=models_eos(folder))


def models_eos(folder) -> int | None:
    """The end-of-sequence token the engine stops on without delivering it: a row ending early chose it."""
    import json

    return json.loads((folder / "config.json").read_text()).get("eos_token_id")
