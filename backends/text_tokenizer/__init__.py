"""The text_tokenizer stage: tokenizer.json tokenizer (no torch)."""
