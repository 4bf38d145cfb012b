"""Code shared by every backend: Triton-free helpers plus the single Triton adapter (triton_io)."""
