"""Artifacts of the codegen pipelines (`codegen` unary, `codegen_stream` streamed): a GPT-J causal LM
plus its tokenizer for the generator, and tokenizer.json for the tokenizer stages.

demo: a small GPT-J (context 1024) and a byte-level BPE, both trained here on the Python standard
library's top-level modules (build/train_codegen.py); fixed seeds and one training thread make re-runs
byte-identical.
hub: moyix/codegen-350M-mono-gptj with the Salesforce/codegen-350M-mono tokenizer.

CODEGEN_DEMO_SIZE=350m gives the demo GPT-J codegen-350M-mono-gptj's architecture (random weights,
same tokenizer): what `make bench` measures the pipeline's overhead against.

Both profiles and sizes also get the GPT-J as OpenVINO IR in codegen_generator/1/openvino/ (the generator's CPU
engine; build/openvino_export.py): fp32 weights, or CODEGEN_WEIGHTS=int8 / int4.
"""
from __future__ import annotations

import os
import sysconfig
from pathlib import Path

from build import openvino_export
from build.common import Progress, seed_everything, trained, version_dir

HUB_MODEL = "moyix/codegen-350M-mono-gptj"
HUB_TOKENIZER = "Salesforce/codegen-350M-mono"
EOS = "<|endoftext|>"
DEMO_VOCAB = 4096
DEMO_SEED = 20240501
DEMO_SIZES = {
    "small": dict(n_positions=1024, n_embd=128, n_layer=3, n_head=4, rotary_dim=16),
    # codegen-350M-mono's shape; its vocabulary is padded to 51200 beyond its tokenizer's, as here
    "350m": dict(vocab_size=51200, n_positions=2048, n_embd=1024, n_layer=20, n_head=16, rotary_dim=32),
}


def stdlib_sources() -> list[Path]:
    """The standard library's top-level modules (~4.7 MB), sorted so training sees a fixed order."""
    return sorted(Path(sysconfig.get_paths()["stdlib"]).glob("*.py"))


def train_demo_tokenizer(texts=None):
    """Byte-level BPE trained on `texts` (default: the standard library's top-level modules as they are)."""
    os.environ["RAYON_NUM_THREADS"] = "1"  # the BPE trainer's merge ties must not depend on thread timing
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=DEMO_VOCAB, special_tokens=[EOS], show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    if texts is None:
        texts = [p.read_text(encoding="utf-8", errors="replace") for p in stdlib_sources()]
    tokenizer.train_from_iterator(texts, trainer=trainer)
    # without model_input_names it would emit token_type_ids, which GPT-J embeds at every position
    return PreTrainedTokenizerFast(tokenizer_object=tokenizer, model_input_names=["input_ids", "attention_mask"],
                                   bos_token=EOS, eos_token=EOS, unk_token=EOS, pad_token=EOS,
                                   clean_up_tokenization_spaces=False)


def demo_size() -> str:
    size = os.environ.get("CODEGEN_DEMO_SIZE", "small")
    if size not in DEMO_SIZES:
        raise SystemExit(f"CODEGEN_DEMO_SIZE={size!r}: choose one of {sorted(DEMO_SIZES)}")
    return size


def demo_model(tokenizer, size: str = "small"):
    import torch
    from transformers import GPTJConfig, GPTJForCausalLM

    eos = tokenizer.convert_tokens_to_ids(EOS)
    shape = dict(DEMO_SIZES[size])
    vocab = max(len(tokenizer), shape.pop("vocab_size", 0))
    config = GPTJConfig(vocab_size=vocab, bos_token_id=eos, eos_token_id=eos, pad_token_id=eos, **shape)
    seed_everything(DEMO_SEED)
    model = GPTJForCausalLM(config).eval()
    with torch.no_grad():  # padding ids never win, as in a trained model (the tokenizer has no text for them)
        model.lm_head.weight[len(tokenizer):] = 0
        model.lm_head.bias[len(tokenizer):] = -100
    model.generation_config.pad_token_id = eos
    return model


def hub_tokenizer_and_model():
    import torch
    from transformers import AutoTokenizer, GPTJForCausalLM

    tokenizer = AutoTokenizer.from_pretrained(HUB_TOKENIZER, use_fast=True)
    tokenizer.model_input_names = ["input_ids", "attention_mask"]
    model = GPTJForCausalLM.from_pretrained(HUB_MODEL, dtype=torch.float32).eval()
    # moyix's conversion kept CodeGen's first release's eos_token_id 2 ('#' in this BPE; Salesforce later fixed
    # theirs to 50256): the generator and transformers' generate would end a completion at its first '#'.
    model.config.eos_token_id = tokenizer.eos_token_id
    model.generation_config.eos_token_id = model.generation_config.pad_token_id = tokenizer.eos_token_id
    return tokenizer, model


def build(profile: str) -> None:
    progress = Progress("codegen", 4)
    label = "hub profile" if profile == "hub" else f"demo profile, {demo_size()} GPT-J"
    weights = openvino_export.weight_format()  # refused before anything is built
    with progress.step(f"tokenizer + GPT-J ({label})"):
        if profile == "hub":
            tokenizer, model = hub_tokenizer_and_model()
        elif demo_size() == "small":  # trained by build/train_codegen.py, reused while its code is unchanged
            from transformers import GPTJForCausalLM, PreTrainedTokenizerFast

            from build import train_codegen

            folder = trained(train_codegen.NAME, train_codegen.train, train_codegen.SOURCES)
            tokenizer = PreTrainedTokenizerFast.from_pretrained(folder)
            model = GPTJForCausalLM.from_pretrained(folder).eval()
        else:
            tokenizer = train_demo_tokenizer()
            model = demo_model(tokenizer, demo_size())
    with progress.step("model + tokenizer -> codegen_generator/1/"):
        dest = version_dir("codegen_generator")
        model.save_pretrained(dest, safe_serialization=True)
        tokenizer.save_pretrained(dest)
    del model  # the export reads the saved weights in a process of its own
    with progress.step(f"OpenVINO IR ({weights} weights) -> codegen_generator/1/{openvino_export.IR_FOLDER}/"):
        openvino_export.export(dest, dest / openvino_export.IR_FOLDER, weights)
    with progress.step("tokenizer.json (+ config.json for the limits) -> codegen_preprocess, codegen_postprocess, "
                       "codegen_stream"):
        for stage, files in (("codegen_preprocess", ("tokenizer.json", "config.json")),
                             ("codegen_postprocess", ("tokenizer.json",)), ("codegen_stream", ("tokenizer.json",))):
            stage_dir = version_dir(stage)
            for name in files:
                (stage_dir / name).write_bytes((dest / name).read_bytes())
