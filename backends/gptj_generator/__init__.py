"""The gptj_generator stage: GPT-J with continuous batching behind an engine seam (seam.py): OpenVINO GenAI or torch, Triton-free."""
