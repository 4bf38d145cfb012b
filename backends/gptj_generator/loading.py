"""Builds the generator's engine from its version folder: `make model`'s transformers weights and tokenizer.json,
and the OpenVINO IR beside them in openvino/ (build/openvino_export.py). Only the chosen engine's library is
imported: an OpenVINO instance never loads torch (~230 MB of RSS per stub)."""
from __future__ import annotations

import inspect
from pathlib import Path

from codegen_common.token_bytes import token_bytes_table

ENGINES = ("openvino", "torch", "auto")
IR_FOLDER = "openvino"
# engine option -> the generator's config parameter (config.pbtxt), its type and its default. An engine takes those
# its constructor names as keywords and is handed no other (own_options): the loop's bounds are every engine's,
# max_scored_rows the OpenVINO scorer's alone
CONFIG_OPTIONS = {
    "max_batch_size": ("max_active_sequences", int, 16),
    "max_tokens_limit": ("max_tokens_limit", int, 512),
    "max_pending": ("max_pending_requests", int, 256),
    "prefill_chunk_tokens": ("prefill_chunk_tokens", int, 256),
    "max_stop_words": ("max_stop_words", int, 8),
    "max_stop_word_chars": ("max_stop_word_chars", int, 64),
    "cancel_poll_seconds": ("cancel_poll_seconds", float, 0.0),
    "max_scored_rows": ("max_scored_rows", int, 1),
    # the OpenVINO engine's (openvino_engine.py says why each): prefix caching on, its KV cache grown on demand
    # (0) or bounded in tokens, prompt lookup off, auto precision (bf16 where the CPU computes it, else f32)
    "prefix_caching": ("prefix_caching", bool, True),
    "kv_cache_tokens": ("kv_cache_tokens", int, 0),
    "prompt_lookup_tokens": ("prompt_lookup_tokens", int, 0),
    "precision": ("precision", str, "auto"),
}


def choose_engine(setting: str, gpu: bool) -> str:
    """The `engine` parameter for an instance Triton placed on a GPU or not: auto = OpenVINO on CPU, torch on GPU."""
    if setting not in ENGINES:
        raise ValueError(f"parameter 'engine' must be one of {list(ENGINES)}, not {setting!r}")
    if setting == "auto":
        return "torch" if gpu else "openvino"
    if setting == "openvino" and gpu:
        raise ValueError("engine 'openvino' cannot run a KIND_GPU instance (OpenVINO does not drive NVIDIA GPUs): "
                         "use engine 'torch' or 'auto'")
    return setting


def engine_options(config: dict) -> dict:
    """load_engine's keyword arguments from the generator's config (Triton's JSON form of config.pbtxt): the
    same for the served model and for anything that runs its engine alone (bench/bench_codegen_engines.py)."""
    from stage_common.params import config_param

    return {option: config_param(config, name, kind, default)
            for option, (name, kind, default) in CONFIG_OPTIONS.items()}


def own_options(engine_class: type, options: dict) -> dict:
    """`options` less the config options `engine_class`'s constructor does not name (another engine's); every
    other keyword goes through, so a misspelt one still fails."""
    takes = inspect.signature(engine_class).parameters
    return {key: value for key, value in options.items() if key in takes or key not in CONFIG_OPTIONS}


def load_torch_engine(model_dir: Path, max_batch_size: int, max_tokens_limit: int, device="cpu", on_progress=None,
                      **engine_options):
    import torch
    from transformers import GPTJForCausalLM

    from gptj_generator.torch_engine import TorchEngine

    model = GPTJForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32).to(device).eval()
    return TorchEngine(model, token_bytes_table(Path(model_dir) / "tokenizer.json"), model.config.eos_token_id,
                       max_batch_size=max_batch_size, max_tokens_limit=max_tokens_limit, device=device,
                       on_progress=on_progress, **own_options(TorchEngine, engine_options))


def load_openvino_engine(model_dir: Path, max_batch_size: int, max_tokens_limit: int, threads: int = 1,
                         on_progress=None, ir_dir: Path | None = None, **engine_options):
    from gptj_generator.openvino_engine import OpenVINOEngine

    ir_dir = Path(ir_dir) if ir_dir is not None else Path(model_dir) / IR_FOLDER
    if not (ir_dir / "openvino_model.xml").exists():
        raise FileNotFoundError(f"no OpenVINO IR in {ir_dir}: run `make model` (or set parameter engine: torch)")
    return OpenVINOEngine(ir_dir, token_bytes_table(Path(model_dir) / "tokenizer.json"), max_batch_size,
                          max_tokens_limit, threads=threads, on_progress=on_progress,
                          **own_options(OpenVINOEngine, engine_options))


def load_engine(engine: str, model_dir: Path, max_batch_size: int, max_tokens_limit: int, *, threads: int = 1,
                device="cpu", on_progress=None, **engine_options):
    """engine 'openvino' or 'torch' (choose_engine resolves 'auto'); `threads` is OpenVINO's inference threads
    (torch's are set process-wide by the caller), `device` torch's."""
    if engine == "openvino":
        return load_openvino_engine(model_dir, max_batch_size, max_tokens_limit, threads=threads,
                                    on_progress=on_progress, **engine_options)
    if engine == "torch":
        return load_torch_engine(model_dir, max_batch_size, max_tokens_limit, device=device, on_progress=on_progress,
                                 **engine_options)
    raise ValueError(f"unknown engine {engine!r}")
