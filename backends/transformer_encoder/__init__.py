"""The transformer_encoder stage: transformers encoder (ONNX Runtime or torch): rows of all batched requests sorted by length."""
