"""The clip_encoder stage: both CLIP towers in one stub (text and image ensembles share the weights; ONNX Runtime or torch)."""
