"""The gateway's API key for the clients, benches and Locust files: --api-key, else GATEWAY_API_KEY."""
from __future__ import annotations

import argparse
import os


def add_api_key_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--api-key", default=os.environ.get("GATEWAY_API_KEY"),
                        help="the gateway's API key (default: $GATEWAY_API_KEY; none for an open gateway on loopback)")


def auth_headers(api_key: str | None = None) -> dict[str, str]:
    """`Authorization: Bearer <key>` for `api_key`, else for $GATEWAY_API_KEY, else nothing."""
    key = api_key or os.environ.get("GATEWAY_API_KEY")
    return {"Authorization": f"Bearer {key}"} if key else {}
