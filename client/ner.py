"""Named entities from the served ner ensemble (flair ner-english-fast) over gRPC.

    python client/ner.py "George Washington went to Washington." [more texts] [--json] [--url localhost:8001]
"""
from __future__ import annotations

import argparse
import json
import sys

import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException

from client.string_tensors import string_rows
from client.triton_urls import default_url


def entities(url: str, texts: list[str]) -> list[list[dict]]:
    client = grpcclient.InferenceServerClient(url)
    rows = client.infer("ner", [string_rows("text", texts)]).as_numpy("entities").reshape(-1)
    return [json.loads(row.decode("utf-8")) for row in rows]


def table(found: list[dict]) -> str:
    if not found:
        return "  (no entities)"
    shown = [(repr(e["text"])[1:-1], e["label"], f"{e['start']}-{e['end']}", f"{e['score']:.4f}") for e in found]
    header = ("text", "label", "chars", "score")
    widths = [max(len(row[i]) for row in shown + [header]) for i in range(4)]
    lines = ["  " + "  ".join(h.ljust(w) for h, w in zip(header, widths)),
             "  " + "  ".join("-" * w for w in widths)]
    lines += ["  " + "  ".join(v.ljust(w) for v, w in zip(row, widths)) for row in shown]
    return "\n".join(line.rstrip() for line in lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("texts", nargs="+")
    parser.add_argument("--json", action="store_true", help="print the raw JSON of each row, one per line")
    parser.add_argument("--url", default=default_url("ner"),
                        help="Triton gRPC address (default: GRPC_PORT, 8001; client/triton_urls.py)")
    args = parser.parse_args()
    try:
        rows = entities(args.url, args.texts)
    except InferenceServerException as e:
        print(f"error: {e.message()}", file=sys.stderr)
        return 1
    for i, (text, found) in enumerate(zip(args.texts, rows)):
        if args.json:
            print(json.dumps(found, ensure_ascii=False))
        else:
            print(f"[{i}] {text[:100]!r}\n{table(found)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
