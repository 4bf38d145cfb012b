"""The mean_pooling stage: sentence-transformers pooling modes + L2 normalization (numpy)."""
