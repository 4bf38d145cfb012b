"""Request work of the embedding endpoints and image search: texts and images checked and turned into
vectors through the registry's ensembles (embed.py), image inputs (images.py), token counts for `usage`
(tokens.py), and the CPU pool that keeps that work off the event loop (offload.py)."""
