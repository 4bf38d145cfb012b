"""The image_classifier stage: transformers image classifier -> label, softmax score."""
