"""What flair's FlairEmbeddings feeds its character language model for one sentence, and where it reads
each token's embedding in the LM's output (FlairEmbeddings._add_embeddings_internal and
LanguageModel.get_representation)."""
from __future__ import annotations

from ner_preprocess.flair_sentence import Token


class CharLMEncoding:
    def __init__(self, settings: dict, forward: bool):
        self.chars: dict[str, int] = settings["chars"]
        self.forward = forward
        self.start_marker, self.end_marker = settings["start_marker"], settings["end_marker"]
        self.is_lower, self.tokenized_lm = settings["is_lower"], settings["tokenized_lm"]
        self.with_whitespace = settings["with_whitespace"]
        self.padding_id = self.chars.get(settings["padding_char"], 0)

    def sentence_text(self, tokens: list[Token]) -> str:
        if self.tokenized_lm:  # Sentence.to_tokenized_string
            return " ".join(t.text for t in tokens)
        return "".join(t.text + " " * t.whitespace_after for t in tokens).rstrip()  # to_plain_string

    def encode(self, tokens: list[Token]) -> tuple[list[int], list[int]]:
        """(character ids of the LM's input, the LM output index of each token's embedding)."""
        text = self.sentence_text(tokens)
        lm_text = text.lower() if self.is_lower else text
        if not self.forward:
            lm_text = lm_text[::-1]
        ids = [self.chars.get(ch, 0) for ch in f"{self.start_marker}{lm_text}{self.end_marker}"]
        # flair's offset arithmetic, verbatim (it uses the un-lowered text's length)
        positions = []
        offset_forward = len(self.start_marker)
        offset_backward = len(text) + len(self.start_marker)
        for token in tokens:
            offset_forward += len(token.text)
            at = offset_forward if self.forward else offset_backward
            positions.append(at if self.with_whitespace else at - 1)
            if self.tokenized_lm or token.whitespace_after > 0:
                offset_forward += 1
                offset_backward -= 1
            offset_backward -= len(token.text)
        return ids, positions
