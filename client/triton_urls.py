"""The Triton gRPC address each client script calls by default: `make triton` runs one server per failure
domain (docs/operations.md), the codegen pipelines on CODEGEN_GRPC_PORT (8011) and every other on GRPC_PORT
(8001); with TRITON_DOMAINS=one every pipeline is on GRPC_PORT. The same variables as the launcher's, read
from the environment; `--url` overrides."""
from __future__ import annotations

import os


def default_url(pipeline: str) -> str:
    codegen = pipeline == "codegen" or pipeline.startswith("codegen_")
    if codegen and os.environ.get("TRITON_DOMAINS", "").strip() != "one":
        return f"localhost:{os.environ.get('CODEGEN_GRPC_PORT') or 8011}"
    return f"localhost:{os.environ.get('GRPC_PORT') or 8001}"
