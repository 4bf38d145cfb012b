"""The reference libraries' outputs for the hub profile's models, loaded by their hub ids from the local
cache of tests/hub_layouts.py (run as a child process with that cache's environment: HF_HUB_OFFLINE=1,
HF_HUB_CACHE, FLAIR_CACHE_ROOT, before anything imports huggingface_hub).

Usage: python tests/hub_reference.py <inputs.json> <outputs.json>; inputs: {"texts", "ner_texts",
"images" (base64), "prompts", "max_tokens"}."""
from __future__ import annotations

import base64
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
for path in (ROOT, ROOT / "backends", ROOT / "tests"):
    sys.path.insert(0, str(path))

CAPTION_MAX_NEW_TOKENS = 20  # food_captioning_captioner's max_new_tokens
MAX_PIXELS = 50_000_000  # food_captioning_preprocess's max_megapixels


def embeddings(texts: list[str]) -> list[list[float]]:
    from sentence_transformers import SentenceTransformer

    from hub_layouts import MINILM

    model = SentenceTransformer(MINILM, device="cpu")
    return model.encode(texts, normalize_embeddings=True).tolist()


def entities(texts: list[str]) -> list[list[list]]:
    from flair.models import SequenceTagger

    from hub_layouts import FLAIR_NER
    from ner_reference import flair_entities

    tagger = SequenceTagger.load(FLAIR_NER).eval()
    return [[list(span) for span in row] for row in flair_entities(tagger, texts)]


def captions(images: list[bytes]) -> list[list]:
    """The classifier's own forward and BLIP's own generate on each image as the server decodes it; the
    label through the build's documented rule (LABEL_i is Food-11's class i)."""
    import torch
    from transformers import (AutoImageProcessor, AutoModelForImageClassification, BlipForConditionalGeneration,
                              BlipProcessor)

    from build.food_captioning import FOOD11_LABELS
    from hub_layouts import BLIP, FOOD11
    from image_preprocess.decoding import decode_image

    image_processor = AutoImageProcessor.from_pretrained(FOOD11, use_fast=False)
    classifier = AutoModelForImageClassification.from_pretrained(FOOD11).eval()
    processor = BlipProcessor.from_pretrained(BLIP, use_fast=False)
    blip = BlipForConditionalGeneration.from_pretrained(BLIP).eval()
    out = []
    for data in images:
        image = decode_image(data, MAX_PIXELS)
        with torch.inference_mode():
            pixels = image_processor(images=image, return_tensors="pt", input_data_format="channels_last").pixel_values
            probabilities = classifier(pixel_values=pixels).logits.softmax(-1)[0]
            label = FOOD11_LABELS[int(probabilities.argmax())]
            inputs = processor(images=image, text=f"a photo of {label}".lower(), return_tensors="pt",
                               input_data_format="channels_last")
            ids = blip.generate(**inputs, max_new_tokens=CAPTION_MAX_NEW_TOKENS)[0].tolist()
        out.append([label, float(probabilities.max()), processor.decode(ids, skip_special_tokens=True)])
    return out


def completions(prompts: list[str], max_tokens: int) -> list[str]:
    """transformers' greedy generate on moyix's GPT-J with Salesforce's tokenizer, ending at <|endoftext|>
    (the build replaces the checkpoint's eos_token_id 2, build/codegen.py)."""
    import torch
    from transformers import AutoTokenizer, GPTJForCausalLM

    from hub_layouts import CODEGEN_MODEL, CODEGEN_TOKENIZER

    tokenizer = AutoTokenizer.from_pretrained(CODEGEN_TOKENIZER, use_fast=True)
    model = GPTJForCausalLM.from_pretrained(CODEGEN_MODEL, dtype=torch.float32).eval()
    out = []
    for prompt in prompts:
        encoded = tokenizer(prompt, return_tensors="pt", return_token_type_ids=False)
        with torch.inference_mode():
            ids = model.generate(**encoded, max_new_tokens=max_tokens, do_sample=False,
                                 eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.eos_token_id)
        out.append(tokenizer.decode(ids[0, encoded["input_ids"].shape[1]:], skip_special_tokens=True))
    return out


def main() -> int:
    import torch

    torch.set_num_threads(1)
    inputs = json.loads(Path(sys.argv[1]).read_text())
    outputs = {
        "embeddings": embeddings(inputs["texts"]),
        "entities": entities(inputs["ner_texts"]),
        "captions": captions([base64.b64decode(i) for i in inputs["images"]]),
        "completions": completions(inputs["prompts"], inputs["max_tokens"]),
    }
    Path(sys.argv[2]).write_text(json.dumps(outputs))
    return 0


if __name__ == "__main__":
    sys.exit(main())
