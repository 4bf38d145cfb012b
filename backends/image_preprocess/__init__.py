"""The image_preprocess stage: Pillow decode with limits, HF image processors in numpy (no torch)."""
