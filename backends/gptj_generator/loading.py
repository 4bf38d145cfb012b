"""Builds the generator's engine from its version folder: `make model`'s transformers weights and tokenizer.json,
and the OpenVINO IR beside them in openvino/ (build/openvino_export.py). Only the chosen engine's library is
imported: an OpenVINO instance never loads torch (~230 MB of RSS per stub)."""
from __future__ import annotations

from pathlib import Path

from gptj_generator.token_bytes import token_bytes_table

ENGINES = ("openvino", "torch", "auto")
IR_FOLDER = "openvino"


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

    return dict(max_batch_size=config_param(config, "max_active_sequences", int, 16),
                max_tokens_limit=config_param(config, "max_tokens_limit", int, 512),
                max_pending=config_param(config, "max_pending_requests", int, 256),
                prefill_chunk_tokens=config_param(config, "prefill_chunk_tokens", int, 256),
                max_stop_words=config_param(config, "max_stop_words", int, 8),
                max_stop_word_chars=config_param(config, "max_stop_word_chars", int, 64),
                cancel_poll_seconds=config_param(config, "cancel_poll_seconds", float, 0.0),
                max_scored_rows=config_param(config, "max_scored_rows", int, 1))


def load_torch_engine(model_dir: Path, max_batch_size: int, max_tokens_limit: int, device="cpu", on_progress=None,
                      **engine_options):
    import torch
    from transformers import GPTJForCausalLM

    from gptj_generator.torch_engine import TorchEngine

    # its alternatives come from the logits its batched step has already: no scorer, nothing to bound
    engine_options.pop("max_scored_rows", None)
    model = GPTJForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32).to(device).eval()
    return TorchEngine(model, token_bytes_table(Path(model_dir) / "tokenizer.json"), model.config.eos_token_id,
                       max_batch_size=max_batch_size, max_tokens_limit=max_tokens_limit, device=device,
                       on_progress=on_progress, **engine_options)


def load_openvino_engine(model_dir: Path, max_batch_size: int, max_tokens_limit: int, threads: int = 1,
                         on_progress=None, ir_dir: Path | None = None, **engine_options):
    from gptj_generator.openvino_engine import OpenVINOEngine

    ir_dir = Path(ir_dir) if ir_dir is not None else Path(model_dir) / IR_FOLDER
    if not (ir_dir / "openvino_model.xml").exists():
        raise FileNotFoundError(f"no OpenVINO IR in {ir_dir}: run `make model` (or set parameter engine: torch)")
    return OpenVINOEngine(ir_dir, token_bytes_table(Path(model_dir) / "tokenizer.json"), max_batch_size,
                          max_tokens_limit, threads=threads, on_progress=on_progress, **engine_options)


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
