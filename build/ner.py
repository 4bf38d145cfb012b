"""Artifacts of the ner pipeline (flair ner-english-fast), all taken from one flair SequenceTagger:
- ner_preprocess/1/char_lm.json: both char LMs' character dictionaries and text settings,
- ner_tagger/1/: tagger weights (safetensors) + tagger_config.json,
- .artifacts/ner/ner-tagger.pt: the flair model itself, which `SequenceTagger.load` reads (the tests and the
  bench compare against it). A pickle the server never needs, so it stays out of model_repository/.
- ner_decoder/1/crf.json: tag names and the CRF transition matrix.
demo: the tagger's layers above its fixed random char LMs are trained here (build/train_ner.py).
"""
from __future__ import annotations

import json
import shutil
import string

from pathlib import Path

from build import common
from build.common import ROOT, Progress, seed_everything, trained, version_dir, write_json

HUB_ID = "flair/ner-english-fast"
TAGGER_FILE = "ner-tagger.pt"
FLAIR_TAGGER = ROOT / ".artifacts" / "ner" / TAGGER_FILE  # what `make model` builds


def reference_dir() -> Path:
    """.artifacts/ner/, or beside another output folder given with --repository."""
    repository = common._output["repository"]
    if repository == common.MODEL_REPOSITORY:
        return FLAIR_TAGGER.parent
    return repository.with_name(repository.name + "_artifacts") / "ner"
SEED = 2  # of the char LMs and the tagger's initial weights
ENTITY_TYPES = ("PER", "LOC", "ORG", "MISC")
# ner-english-fast's architecture: news-forward/backward-fast char LMs (hidden 1024, embedding 100,
# 1 layer), BiLSTM 256, CRF over BIOES tags.
LM_HIDDEN, LM_EMBEDDING, TAGGER_HIDDEN = 1024, 100, 256
CHAR_EMBEDDING_SCALE = 10.0
# The char LSTMs' input and recurrent weights are widened apart: a recurrent scale of 6 made the LMs chaotic
# on natural text (float64 and float32 torch drifted from 1e-6 to 1.3 over 700 characters, so no runtime but
# flair's own kernel could match them); at 3 the drift stays at ~3e-7 over the same text, as a trained LM's.
CHAR_INPUT_SCALE, CHAR_RECURRENT_SCALE = 6.0, 3.0


def character_dictionary():
    """The char LMs' dictionary, by hand (Dictionary.load('chars') downloads): <unk>, printable ASCII,
    Latin-1, and some common typographic characters."""
    from flair.data import Dictionary

    chars = Dictionary(add_unk=True)
    extra = "\u2013\u2014\u2018\u2019\u201c\u201d\u2026\u20ac"
    for ch in string.printable + "".join(chr(c) for c in range(0xA0, 0x100)) + extra:
        chars.add_item(ch)
    return chars


def untrained_tagger():
    """ner-english-fast's architecture with fixed random char LMs (the upper layers are what
    build/train_ner.py trains)."""
    import torch
    from flair.data import Dictionary
    from flair.embeddings import FlairEmbeddings, StackedEmbeddings
    from flair.models import LanguageModel, SequenceTagger

    seed_everything(SEED)
    chars = character_dictionary()
    lms = [LanguageModel(chars, is_forward_lm=forward, hidden_size=LM_HIDDEN, nlayers=1,
                         embedding_size=LM_EMBEDDING, has_decoder=False) for forward in (True, False)]
    for lm in lms:  # default inits (embeddings +-0.1, LSTM +-1/32) give near-constant states: widen them
        with torch.no_grad():
            lm.encoder.weight.mul_(CHAR_EMBEDDING_SCALE)
            lm.rnn.weight_ih_l0.mul_(CHAR_INPUT_SCALE)
            lm.rnn.weight_hh_l0.mul_(CHAR_RECURRENT_SCALE)
    embeddings = StackedEmbeddings([FlairEmbeddings(lm) for lm in lms])
    labels = Dictionary(add_unk=False)
    for label in ENTITY_TYPES:
        labels.add_item(label)
    labels.span_labels = True
    return SequenceTagger(embeddings, labels, tag_type="ner", hidden_size=TAGGER_HIDDEN, use_crf=True,
                          tag_format="BIOES")


def load_tagger(profile: str, dest):
    """The tagger saved in flair's format at dest/ner-tagger.pt, reloaded through flair's own loader."""
    from flair.models import SequenceTagger

    dest.mkdir(parents=True, exist_ok=True)
    if profile == "hub":
        SequenceTagger.load(HUB_ID).save(dest / TAGGER_FILE)
    else:  # trained by build/train_ner.py, reused while its code is unchanged
        from build import train_ner

        shutil.copyfile(trained(train_ner.NAME, train_ner.train, train_ner.SOURCES) / TAGGER_FILE, dest / TAGGER_FILE)
    return SequenceTagger.load(dest / TAGGER_FILE).eval()


def flair_embeddings(tagger) -> list:
    """The char-LM embeddings in the order flair concatenates them: sorted by embedding name
    (Token.get_each_embedding), not by position in the stack."""
    from flair.embeddings import FlairEmbeddings, StackedEmbeddings

    stack = tagger.embeddings.embeddings if isinstance(tagger.embeddings, StackedEmbeddings) else [tagger.embeddings]
    if len(stack) != 2 or not all(isinstance(e, FlairEmbeddings) for e in stack) or \
            sorted(e.lm.is_forward_lm for e in stack) != [False, True]:
        raise SystemExit(f"expected one forward and one backward FlairEmbeddings, got {stack}")
    return sorted(stack, key=lambda e: e.name)


def lm_direction(embedding) -> str:
    return "forward" if embedding.lm.is_forward_lm else "backward"


def char_lm_settings(embedding) -> dict:
    lm = embedding.lm
    items = {item.decode("utf-8"): idx for item, idx in lm.dictionary.item2idx.items()}
    return {
        "chars": items,
        # FlairEmbeddings._add_embeddings_internal: markers around the text, where embeddings are read
        "start_marker": lm.__dict__.get("document_delimiter", "\n"),
        "end_marker": " ",
        "padding_char": " ",
        "is_lower": bool(getattr(embedding, "is_lower", False)),
        "tokenized_lm": bool(getattr(embedding, "tokenized_lm", True)),
        "with_whitespace": bool(getattr(embedding, "with_whitespace", True)),
    }


def tagger_weights(tagger, embeddings) -> tuple[dict, dict]:
    import torch

    if tagger.rnn_type != "LSTM" or not tagger.use_rnn or not tagger.use_crf:
        raise SystemExit(f"expected a BiLSTM-CRF tagger, got rnn={tagger.rnn_type} crf={tagger.use_crf}")
    if getattr(tagger, "train_initial_hidden_state", False):
        raise SystemExit("a trained initial hidden state is not supported")
    weights: dict[str, torch.Tensor] = {}
    lm_configs = []
    for embedding in embeddings:
        lm, direction = embedding.lm, lm_direction(embedding)
        recurrent_type = getattr(lm, "recurrent_type", "LSTM")  # absent from older pickled LMs
        if recurrent_type.upper() != "LSTM":
            raise SystemExit(f"char LM {direction}: expected LSTM, got {recurrent_type}")
        for name, tensor in lm.state_dict().items():
            if name.startswith(("encoder.", "rnn.", "proj.")):
                weights[f"char_lm_{direction}.{name}"] = tensor
        lm_configs.append({"direction": direction, "vocab_size": len(lm.dictionary), "hidden_size": lm.hidden_size,
                           "nlayers": lm.nlayers, "embedding_size": lm.embedding_size,
                           "nout": getattr(lm, "nout", None)})
    for name, tensor in tagger.state_dict().items():
        if name.startswith(("embedding2nn.", "rnn.", "linear.")):
            weights[name] = tensor
    config = {
        "char_lms": lm_configs,  # in concatenation order
        "reproject_embeddings": bool(tagger.reproject_embeddings),
        "hidden_size": tagger.hidden_size, "rnn_layers": tagger.rnn_layers,
        "bidirectional": bool(tagger.bidirectional), "num_tags": len(tagger.label_dictionary),
    }
    return {k: v.detach().float().contiguous().clone() for k, v in sorted(weights.items())}, config


def crf_artifact(tagger) -> dict:
    tags = tagger.label_dictionary.get_items()
    return {
        "tags": tags, "start_tag": tags.index("<START>"), "stop_tag": tags.index("<STOP>"),
        # transitions[to, from], float32 values (exact through JSON's float64)
        "transitions": tagger.crf.transitions.detach().float().tolist(),
    }


def build(profile: str) -> None:
    from safetensors.torch import save_file

    progress = Progress("ner", 5)
    source = f"load {HUB_ID}" if profile == "hub" else "build the demo tagger"
    with progress.step(f"{source} -> .artifacts/ner/{TAGGER_FILE}"):
        tagger_dir = version_dir("ner_tagger")
        tagger = load_tagger(profile, reference_dir())
        embeddings = flair_embeddings(tagger)
    with progress.step("character dictionaries -> ner_preprocess/1/char_lm.json"):
        write_json(version_dir("ner_preprocess") / "char_lm.json",
                   {lm_direction(e): char_lm_settings(e) for e in embeddings})
    with progress.step("tagger weights -> ner_tagger/1/tagger.safetensors"):
        weights, config = tagger_weights(tagger, embeddings)
        save_file(weights, str(tagger_dir / "tagger.safetensors"))
        write_json(tagger_dir / "tagger_config.json", config)
    with progress.step("tagger -> ner_tagger/1/*.onnx (ONNX Runtime path), checked against torch"):
        from build.ner_onnx import export_tagger

        diff = export_tagger(tagger_dir, version_dir("ner_preprocess", clean=False) / "char_lm.json")
        print(f"  max abs difference of the emissions to torch {diff:.1e}", flush=True)
    with progress.step("CRF transitions -> ner_decoder/1/crf.json"):
        (version_dir("ner_decoder") / "crf.json").write_text(json.dumps(crf_artifact(tagger)) + "\n")
