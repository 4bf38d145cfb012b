"""The ner_preprocess stage: flair's Sentence tokenization with offsets, char-LM ids (no torch, no flair)."""
