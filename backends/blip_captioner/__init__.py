"""The blip_captioner stage: BLIP captioning batched by prompt length (ONNX Runtime + numpy greedy loop, or torch generate)."""
