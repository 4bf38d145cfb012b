"""The codegen_preprocess stage: BPE tokenizer and request checks (no torch)."""
