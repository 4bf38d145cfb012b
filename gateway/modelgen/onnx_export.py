"""Export a transformers encoder to ONNX (dynamic batch and sequence axes) and check it against torch.

`make model` (build/) calls this for every encoder the stages can run with ONNX Runtime; the largest absolute
difference to torch on a padded batch of mixed lengths is printed and must stay under `tolerance`.
BLIP's captioner is exported as two graphs (vision, and a text decoder with a key/value cache) for a
greedy loop in numpy, checked the same way. A CLIPModel is exported as its two towers (text.onnx,
image.onnx), checked the same way.

The gateway exports the models it registers at run time through the command line below, in a
subprocess (the gateway process never imports torch):

    python -m gateway.modelgen.onnx_export {encoder,clip} MODEL_DIR OUT_DIR [--tolerance T]

It writes the graphs into OUT_DIR and prints one JSON line, {"files": [...], "max_abs_diff": ...};
exit status 2 when the model cannot be exported or differs from torch by more than T (the bad graphs
deleted), 1 on any other failure."""
from __future__ import annotations

import json
import warnings
from pathlib import Path

import numpy as np

OPSET = 17


def _probe_batch(vocab_size: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Three rows of different lengths, right-padded: checks the mask path as well as the values."""
    rng = np.random.default_rng(seed)
    lengths = [5, 17, 11]
    ids = np.zeros((len(lengths), max(lengths)), dtype=np.int64)
    mask = np.zeros_like(ids)
    for row, n in enumerate(lengths):
        ids[row, :n] = rng.integers(100, min(vocab_size, 30000), n)
        mask[row, :n] = 1
    return ids, mask


def export_encoder(model_dir: Path, out_path: Path, tolerance: float = 1e-4) -> float:
    """model_dir (transformers AutoModel folder) -> out_path (ONNX: input_ids, attention_mask ->
    last_hidden_state). Returns the max abs difference to torch over the real (unpadded) tokens."""
    import onnxruntime as ort
    import torch
    from transformers import AutoModel

    def load():
        # eager attention traces to plain ops; sdpa's mask handling does not export cleanly
        return AutoModel.from_pretrained(str(model_dir), attn_implementation="eager").eval()

    class LastHiddenState(torch.nn.Module):
        def __init__(self, model):
            super().__init__()
            self.model = model

        def forward(self, input_ids, attention_mask):
            return self.model(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state

    reference_model = load()  # exporting may change a model's settings: compare against an untouched one
    ids, mask = _probe_batch(reference_model.config.vocab_size)
    with torch.inference_mode():
        reference = reference_model(input_ids=torch.from_numpy(ids), attention_mask=torch.from_numpy(mask)).last_hidden_state.numpy()
    axes = {0: "batch", 1: "sequence"}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(LastHiddenState(load()), (torch.from_numpy(ids), torch.from_numpy(mask)), str(out_path),
                          input_names=["input_ids", "attention_mask"], output_names=["last_hidden_state"],
                          dynamic_axes={"input_ids": axes, "attention_mask": axes, "last_hidden_state": axes},
                          opset_version=OPSET, dynamo=False)
    session = ort.InferenceSession(str(out_path), providers=["CPUExecutionProvider"])
    out = session.run(None, {"input_ids": ids, "attention_mask": mask})[0]
    real = mask.astype(bool)
    diff = float(np.abs(out[real] - reference[real]).max())
    if not diff <= tolerance:
        out_path.unlink(missing_ok=True)
        raise SystemExit(f"{out_path}: ONNX differs from torch by {diff:.2e} (> {tolerance:.0e})")
    return diff


def export_image_classifier(model_dir: Path, out_path: Path, tolerance: float = 1e-4) -> float:
    """model_dir (transformers image-classification folder) -> out_path (ONNX: pixel_values [batch, 3,
    height, width] -> logits [batch, classes]). Returns the max abs difference of the logits to torch on
    two probe sizes (the export's dynamic axes must hold for sizes other than the traced one)."""
    import onnxruntime as ort
    import torch
    from transformers import AutoModelForImageClassification

    def load():
        return AutoModelForImageClassification.from_pretrained(str(model_dir)).eval()

    class Logits(torch.nn.Module):
        def __init__(self, model):
            super().__init__()
            self.model = model

        def forward(self, pixel_values):
            return self.model(pixel_values=pixel_values).logits

    reference_model = load()
    size = reference_model.config.image_size if hasattr(reference_model.config, "image_size") else 224
    rng = np.random.default_rng(0)
    probes = [rng.standard_normal((3, 3, size, size)).astype(np.float32),
              rng.standard_normal((2, 3, size + 32, size + 16)).astype(np.float32)]
    pixel_axes = {0: "batch", 2: "height", 3: "width"}
    try:
        with torch.inference_mode():
            reference_model(pixel_values=torch.from_numpy(probes[1]))
    except ValueError:  # a ViT takes only its own image size (its processor resizes to it): batch alone is dynamic
        probes, pixel_axes = [probes[0], probes[0][:2]], {0: "batch"}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(Logits(load()), (torch.from_numpy(probes[0]),), str(out_path),
                          input_names=["pixel_values"], output_names=["logits"],
                          dynamic_axes={"pixel_values": pixel_axes, "logits": {0: "batch"}},
                          opset_version=OPSET, dynamo=False)
    session = ort.InferenceSession(str(out_path), providers=["CPUExecutionProvider"])
    diff = 0.0
    for pixels in probes:
        with torch.inference_mode():
            reference = reference_model(pixel_values=torch.from_numpy(pixels)).logits.numpy()
        diff = max(diff, float(np.abs(session.run(None, {"pixel_values": pixels})[0] - reference).max()))
    if not diff <= tolerance:
        out_path.unlink(missing_ok=True)
        raise SystemExit(f"{out_path}: ONNX differs from torch by {diff:.2e} (> {tolerance:.0e})")
    return diff


# Settings under which transformers' generate adds a logits processor (or stop criterion) to greedy
# search; the stub's greedy loop applies none, so a model that sets one is not exported.
_GENERATE_EXTRAS = ("repetition_penalty", "encoder_repetition_penalty", "no_repeat_ngram_size",
                    "encoder_no_repeat_ngram_size", "bad_words_ids", "min_length", "min_new_tokens",
                    "forced_bos_token_id", "forced_eos_token_id", "remove_invalid_values",
                    "exponential_decay_length_penalty", "suppress_tokens", "begin_suppress_tokens",
                    "sequence_bias", "guidance_scale", "renormalize_logits", "watermarking_config", "max_time",
                    "stop_strings")


def _blip_names(layers: int) -> dict[str, list[str]]:
    """Per-layer tensor names: vision.onnx's outputs are decoder.onnx's cross inputs, and its presents
    come back as the next step's pasts, in the same order."""
    def per_layer(prefix: str) -> list[str]:
        return [f"{prefix}_{kind}.{i}" for i in range(layers) for kind in ("key", "value")]

    return {"cross": per_layer("cross"), "past": per_layer("past"), "present": per_layer("present")}


def _refuse_generate_extras(model) -> None:
    from transformers import GenerationConfig

    defaults, config = GenerationConfig(), model.text_decoder.generation_config
    extras = [name for name in _GENERATE_EXTRAS if getattr(config, name, None) != getattr(defaults, name, None)]
    if extras:
        raise SystemExit(f"BLIP's text decoder sets {extras}: the ONNX greedy loop does not reproduce them")


def export_blip_captioner(model_dir: Path, out_dir: Path, tolerance: float = 1e-4) -> float:
    """model_dir (BlipForConditionalGeneration folder) -> out_dir/vision.onnx, decoder.onnx and
    blip_generation.json, for a greedy loop with a key/value cache that needs neither torch nor
    transformers (backends/blip_captioner/onnx_blip.py):

    vision.onnx   pixel_values [batch, 3, size, size] -> per text layer, cross_key.i / cross_value.i
                  [batch, heads, patches, head_dim]: the vision model, then the decoder's cross-attention
                  key/value projections of its output, computed once per image as generate caches them.
    decoder.onnx  input_ids [batch, new], past_key.i / past_value.i [batch, heads, past, head_dim] (past
                  may be 0: the prompt step) and the cross keys/values -> logits [batch, vocab] of the
                  last position and present_key.i / present_value.i (past + new).

    The decoder is BLIP's own text decoder traced with its cache; only its LM head is applied to the
    last position alone (position-wise: the same numbers). Returns the max abs difference of the cross
    keys/values and of the logits to torch over prompt and cached steps of two batches."""
    import torch
    from transformers import BlipForConditionalGeneration
    from transformers.cache_utils import EncoderDecoderCache

    def load():
        return BlipForConditionalGeneration.from_pretrained(str(model_dir), attn_implementation="eager").eval()

    reference = load()
    _refuse_generate_extras(reference)
    text_config = reference.config.text_config
    layers = text_config.num_hidden_layers
    names = _blip_names(layers)

    class Vision(torch.nn.Module):
        def __init__(self, model):
            super().__init__()
            self.vision, self.layers = model.vision_model, model.text_decoder.bert.encoder.layer

        def forward(self, pixel_values):
            return tuple(_cross_keys_values(self.layers, self.vision(pixel_values=pixel_values)[0]))

    class Decoder(torch.nn.Module):
        def __init__(self, model):
            super().__init__()
            self.decoder = model.text_decoder

        def forward(self, input_ids, *past_and_cross):
            past, cross = past_and_cross[:2 * layers], past_and_cross[2 * layers:]
            cache = EncoderDecoderCache.from_legacy_cache(
                [(past[2 * i], past[2 * i + 1], cross[2 * i], cross[2 * i + 1]) for i in range(layers)])
            # With the cross keys/values cached, BLIP reads only the (batch, patches) shape of the image
            # embeddings (for its all-ones image mask): a slice of the cached keys has that shape.
            hidden = self.decoder.bert(input_ids=input_ids, encoder_hidden_states=cross[0][:, 0],
                                       past_key_values=cache, use_cache=True, is_decoder=True).last_hidden_state
            logits = self.decoder.cls(hidden[:, -1:, :])[:, 0, :]
            return (logits, *(t for layer in cache.self_attention_cache.layers for t in (layer.keys, layer.values)))

    size = reference.config.vision_config.image_size
    rng = np.random.default_rng(0)
    pixels = torch.from_numpy(rng.standard_normal((3, 3, size, size)).astype(np.float32))
    vision_path, decoder_path = out_dir / "vision.onnx", out_dir / "decoder.onnx"
    batch = {0: "batch"}
    with torch.inference_mode():
        cross = Vision(reference)(pixels)
    # traced mid-generation (a past of 3, 2 new tokens) so the graph holds for any past and new length
    ids = torch.from_numpy(rng.integers(1000, 2000, (3, 2)))
    past = [torch.from_numpy(rng.standard_normal((3, t.shape[1], 3, t.shape[3])).astype(np.float32)) for t in cross]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(Vision(load()), (pixels,), str(vision_path), input_names=["pixel_values"],
                          output_names=names["cross"],
                          dynamic_axes={"pixel_values": batch, **{n: batch for n in names["cross"]}},
                          opset_version=OPSET, dynamo=False)
        torch.onnx.export(Decoder(load()), (ids, *past, *cross), str(decoder_path),
                          input_names=["input_ids", *names["past"], *names["cross"]],
                          output_names=["logits", *names["present"]],
                          dynamic_axes={"input_ids": {0: "batch", 1: "new"}, "logits": batch,
                                        **{n: {0: "batch", 2: "past"} for n in names["past"]},
                                        **{n: batch for n in names["cross"]},
                                        **{n: {0: "batch", 2: "total"} for n in names["present"]}},
                          opset_version=OPSET, dynamo=False)
    diff = _check_blip(reference, vision_path, decoder_path, names, rng)
    if not diff <= tolerance:
        vision_path.unlink(missing_ok=True)
        decoder_path.unlink(missing_ok=True)
        raise SystemExit(f"{out_dir}: BLIP ONNX differs from torch by {diff:.2e} (> {tolerance:.0e})")
    # what BlipForConditionalGeneration.generate passes to its text decoder's generate
    (out_dir / "blip_generation.json").write_text(json.dumps(
        {"bos_token_id": text_config.bos_token_id, "eos_token_id": text_config.sep_token_id,
         "pad_token_id": text_config.pad_token_id, "image_size": size}, indent=2, sort_keys=True) + "\n")
    return diff


def _cross_keys_values(layers, image_embeds) -> list:
    """Per text layer, the cross-attention keys and values of the image embeddings, shaped as
    BlipTextSelfAttention shapes them: [batch, heads, patches, head_dim]."""
    out = []
    for layer in layers:
        attention = layer.crossattention.self
        for projection in (attention.key, attention.value):
            out.append(projection(image_embeds).view(image_embeds.shape[0], -1, attention.num_attention_heads,
                                                     attention.attention_head_size).transpose(1, 2))
    return out


def _check_blip(reference, vision_path: Path, decoder_path: Path, names: dict[str, list[str]], rng) -> float:
    """Max abs difference to torch: the cross keys/values, then the logits of a prompt step (empty past)
    and three cached one-token steps, each against torch's uncached forward over the whole sequence."""
    import onnxruntime as ort
    import torch

    vision = ort.InferenceSession(str(vision_path), providers=["CPUExecutionProvider"])
    decoder = ort.InferenceSession(str(decoder_path), providers=["CPUExecutionProvider"])
    size, text = reference.config.vision_config.image_size, reference.config.text_config
    diff = 0.0
    for batch, prompt in ((1, 4), (4, 7)):
        pixels = rng.standard_normal((batch, 3, size, size)).astype(np.float32)
        cross = vision.run(None, {"pixel_values": pixels})
        with torch.inference_mode():
            image_embeds = reference.vision_model(pixel_values=torch.from_numpy(pixels))[0]
            expected = _cross_keys_values(reference.text_decoder.bert.encoder.layer, image_embeds)
        diff = max([diff] + [float(np.abs(got - want.numpy()).max()) for got, want in zip(cross, expected)])
        sequence = rng.integers(1000, 2000, (batch, prompt))
        sequence[:, 0] = text.bos_token_id
        past = [np.zeros((batch, *t.shape[1:2], 0, t.shape[3]), np.float32) for t in cross]
        new = sequence
        for _ in range(4):
            logits, *past = decoder.run(None, {"input_ids": new, **dict(zip(names["past"], past)),
                                               **dict(zip(names["cross"], cross))})
            with torch.inference_mode():
                want = reference.text_decoder(input_ids=torch.from_numpy(sequence), encoder_hidden_states=image_embeds,
                                              use_cache=False).logits[:, -1].numpy()
            diff = max(diff, float(np.abs(logits - want).max()))
            new = logits.argmax(-1)[:, None].astype(np.int64)
            sequence = np.concatenate([sequence, new], axis=1)
    return diff


# ---------------------------------------------------------------- CLIP

CLIP_FILES = ("text.onnx", "image.onnx")


def _clip_text_batch(text_config, lengths: list[int], rng) -> tuple[np.ndarray, np.ndarray]:
    """Token rows as a CLIP tokenizer makes them: each ends with the end-of-text token and is right-padded
    with it (CLIP pads with <|endoftext|>). transformers pools at the first `eos_token_id`, or, for configs
    with the legacy eos_token_id 2, at the largest id of the row (the real end-of-text is the last id of
    the vocabulary): the rows end with that id then."""
    vocab = int(text_config.vocab_size)
    legacy = text_config.eos_token_id == 2
    end = vocab - 1 if legacy else int(text_config.eos_token_id)
    ids = np.full((len(lengths), max(lengths)), end, dtype=np.int64)
    mask = np.zeros_like(ids)
    for row, n in enumerate(lengths):
        body = rng.integers(0, vocab - 1 if legacy else vocab, n - 1)
        if not legacy:
            body[body == end] = (end + 1) % vocab
        ids[row, : n - 1] = body
        mask[row, :n] = 1
    return ids, mask


def _clip_text_probes(text_config, seed: int = 0) -> list[tuple[np.ndarray, np.ndarray]]:
    """Batches of lengths from 2 to the longest allowed, with and without padding, so the pooling at each
    row's end-of-text token is checked at every kind of position."""
    rng = np.random.default_rng(seed)
    longest = int(text_config.max_position_embeddings)
    return [_clip_text_batch(text_config, lengths, rng)
            for lengths in ([2, 9, min(33, longest), longest], [5], [12, 12, 12], [longest, 3])]


def export_clip(model_dir: Path, out_dir: Path, tolerance: float = 1e-4) -> dict[str, float]:
    """model_dir (transformers CLIPModel folder) -> out_dir/text.onnx and out_dir/image.onnx:

    text.onnx   input_ids, attention_mask [batch, sequence] int64 -> text_embeds [batch, projection_dim]:
                CLIPModel.get_text_features (text tower, pooled at each row's end-of-text token, projection)
    image.onnx  pixel_values [batch, 3, size, size] float32 -> image_embeds [batch, projection_dim]:
                CLIPModel.get_image_features (the vision tower's position embeddings fix the image size)

    Dynamic batch (and sequence) axes. Returns the max abs difference of each graph's output to torch's
    (the model as the torch runtime loads it) over token batches of lengths 2..max_position_embeddings
    with padding, and image batches of 1 and 3; above `tolerance` both graphs are deleted."""
    import gc

    import onnxruntime as ort
    import torch
    from transformers import CLIPModel

    rng = np.random.default_rng(0)
    reference = CLIPModel.from_pretrained(str(model_dir)).eval()
    config = reference.config
    size = int(config.vision_config.image_size)
    text_probes = _clip_text_probes(config.text_config)
    image_probes = [rng.standard_normal((n, 3, size, size)).astype(np.float32) for n in (3, 1)]
    with torch.inference_mode():
        text_refs = [reference.get_text_features(input_ids=torch.from_numpy(ids),
                                                 attention_mask=torch.from_numpy(mask)).numpy()
                     for ids, mask in text_probes]
        image_refs = [reference.get_image_features(pixel_values=torch.from_numpy(p)).numpy() for p in image_probes]
    del reference
    gc.collect()
    # eager attention traces to plain ops (sdpa's mask handling does not export cleanly)
    model = CLIPModel.from_pretrained(str(model_dir), attn_implementation="eager").eval()

    class Text(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.model = model

        def forward(self, input_ids, attention_mask):
            return self.model.get_text_features(input_ids=input_ids, attention_mask=attention_mask)

    class Image(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.model = model

        def forward(self, pixel_values):
            return self.model.get_image_features(pixel_values=pixel_values)

    text_path, image_path = out_dir / CLIP_FILES[0], out_dir / CLIP_FILES[1]
    # traced on a padded batch of 2 whose shape is no probe's: the checks show the graph did not keep it
    trace_ids, trace_mask = _clip_text_batch(config.text_config, [7, 3], rng)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with torch.no_grad():
            torch.onnx.export(Text(), (torch.from_numpy(trace_ids), torch.from_numpy(trace_mask)), str(text_path),
                              input_names=["input_ids", "attention_mask"], output_names=["text_embeds"],
                              dynamic_axes={"input_ids": {0: "batch", 1: "sequence"},
                                            "attention_mask": {0: "batch", 1: "sequence"}, "text_embeds": {0: "batch"}},
                              opset_version=OPSET, dynamo=False)
            torch.onnx.export(Image(), (torch.from_numpy(image_probes[0][:2]),), str(image_path),
                              input_names=["pixel_values"], output_names=["image_embeds"],
                              dynamic_axes={"pixel_values": {0: "batch"}, "image_embeds": {0: "batch"}},
                              opset_version=OPSET, dynamo=False)
    text = ort.InferenceSession(str(text_path), providers=["CPUExecutionProvider"])
    image = ort.InferenceSession(str(image_path), providers=["CPUExecutionProvider"])
    diffs = {
        "text": max(float(np.abs(text.run(None, {"input_ids": ids, "attention_mask": mask})[0] - ref).max())
                    for (ids, mask), ref in zip(text_probes, text_refs)),
        "image": max(float(np.abs(image.run(None, {"pixel_values": p})[0] - ref).max())
                     for p, ref in zip(image_probes, image_refs)),
    }
    if not max(diffs.values()) <= tolerance:
        text_path.unlink(missing_ok=True)
        image_path.unlink(missing_ok=True)
        raise SystemExit(f"{out_dir}: CLIP ONNX differs from torch by {diffs} (> {tolerance:.0e})")
    return diffs


# ---------------------------------------------------------------- command line (the gateway's subprocess)

def main(argv: list[str] | None = None) -> int:
    import argparse
    import sys
    import time

    parser = argparse.ArgumentParser(description="Export a model for the ONNX Runtime path and check it against torch.")
    parser.add_argument("kind", choices=("encoder", "clip"))
    parser.add_argument("model_dir", type=Path)
    parser.add_argument("out_dir", type=Path)
    parser.add_argument("--tolerance", type=float, default=1e-4)
    args = parser.parse_args(argv)
    args.out_dir.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    try:
        if args.kind == "clip":
            diff = export_clip(args.model_dir, args.out_dir, args.tolerance)
            files = list(CLIP_FILES)
        else:
            diff = export_encoder(args.model_dir, args.out_dir / "model.onnx", args.tolerance)
            files = ["model.onnx"]
    except ImportError as exc:  # the environment, not the model: worth retrying once fixed
        print(f"cannot export: {exc}", file=sys.stderr)
        return 1
    except SystemExit as exc:  # differs from torch by more than the tolerance
        print(str(exc.code), file=sys.stderr)
        return 2
    except Exception as exc:  # noqa: BLE001 - the model does not export (architecture, size, ...)
        print(f"export failed: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 2
    print(json.dumps({"files": files, "max_abs_diff": diff, "seconds": round(time.monotonic() - started, 2)}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
