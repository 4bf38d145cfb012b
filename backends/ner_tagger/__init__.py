"""The ner_tagger stage: flair char LMs + BiLSTM + linear emissions (ONNX Runtime or torch; rows.py Triton- and torch-free)."""
