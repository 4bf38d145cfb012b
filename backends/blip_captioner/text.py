"""BLIP's BERT tokenizer without transformers: the `tokenizers` file written by `make model`
(tokenizer.json, converted from the slow BertTokenizer) and the slow tokenizer's decoding clean-up."""
from __future__ import annotations

import json
from pathlib import Path

TOKENIZER_FILE = "tokenizer.json"
# transformers' PreTrainedTokenizerBase.clean_up_tokenization, in its order. The tokenizers decoder's
# own clean-up works token by token (it misses " ' " across tokens), so tokenizer.json has it off.
_CLEAN_UP = ((" .", "."), (" ?", "?"), (" !", "!"), (" ,", ","), (" ' ", "'"), (" n't", "n't"), (" 'm", "'m"),
             (" 's", "'s"), (" 've", "'ve"), (" 're", "'re"))


def clean_up_tokenization(text: str) -> str:
    for dirty, clean in _CLEAN_UP:
        text = text.replace(dirty, clean)
    return text


class BlipText:
    """encode: a prompt -> [CLS] ... [SEP] ids; decode: ids -> text without special tokens, both as
    BlipProcessor's slow BertTokenizer gives them (tests/test_food_captioning_stages.py checks)."""

    def __init__(self, model_dir: Path):
        from tokenizers import Tokenizer

        self.tokenizer = Tokenizer.from_file(str(Path(model_dir) / TOKENIZER_FILE))
        config = json.loads((Path(model_dir) / "tokenizer_config.json").read_text())
        self.clean_up = bool(config.get("clean_up_tokenization_spaces", False))

    def encode(self, text: str) -> list[int]:
        return self.tokenizer.encode(text).ids

    def decode(self, sequences: list[list[int]]) -> list[str]:
        texts = self.tokenizer.decode_batch(sequences, skip_special_tokens=True)
        return [clean_up_tokenization(t) for t in texts] if self.clean_up else texts
