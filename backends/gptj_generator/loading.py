"""Builds the generation engine from a model folder (save_pretrained model + tokenizer.json)."""
from __future__ import annotations

from pathlib import Path

import torch
from transformers import GPTJForCausalLM

from gptj_generator.engine import GenerationEngine
from gptj_generator.token_bytes import token_bytes_table


def load_engine(model_dir: Path, max_batch_size: int, max_tokens_limit: int,
                device: torch.device | str = "cpu", on_progress=None, **engine_options) -> GenerationEngine:
    model = GPTJForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32).to(device).eval()
    return GenerationEngine(model, token_bytes_table(Path(model_dir) / "tokenizer.json"), model.config.eos_token_id,
                            max_batch_size=max_batch_size, max_tokens_limit=max_tokens_limit, device=device,
                            on_progress=on_progress, **engine_options)
