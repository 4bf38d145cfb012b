"""Export a transformers encoder to ONNX (dynamic batch and sequence axes) and check it against torch.

`make model` calls this for every encoder the stages can run with ONNX Runtime; the largest absolute
difference to torch on a padded batch of mixed lengths is printed and must stay under `tolerance`.
BLIP's captioner is exported as two graphs (vision, and a text decoder with a key/value cache) for a
greedy loop in numpy, checked the same way."""
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
              rng.standard_normal((2, 3, size + 32, size - 32)).astype(np.float32)]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(Logits(load()), (torch.from_numpy(probes[0]),), str(out_path),
                          input_names=["pixel_values"], output_names=["logits"],
                          dynamic_axes={"pixel_values": {0: "batch", 2: "height", 3: "width"}, "logits": {0: "batch"}},
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
