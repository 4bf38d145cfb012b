"""MkDocs hook: the gateway's OpenAPI document, generated from the app at build time (no server needed),
added to the site as openapi.json (a generated file, never written into docs/) for the API page's
swagger-ui tag, and a Markdown table of its operations in place of the page's `<!-- openapi:operations -->`
marker."""
from __future__ import annotations

import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
MARKER = "<!-- openapi:operations -->"
METHODS = ("get", "post", "put", "patch", "delete")


def openapi_document() -> dict:
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))
    from gateway.app import create_app

    return create_app().openapi()  # routes only: the lifespan (Triton, models) is never entered


def operations_table(document: dict) -> str:
    rows = ["| method | path | summary |", "|---|---|---|"]
    for path, item in document["paths"].items():
        for method, op in item.items():
            if method in METHODS:
                summary = (op.get("summary") or "").replace("|", "\\|")
                rows.append(f"| `{method.upper()}` | `{path}` | {summary} |")
    return "\n".join(rows)


_document: dict | None = None


def on_pre_build(config, **kwargs) -> None:
    global _document
    _document = openapi_document()


def on_files(files, config, **kwargs):
    from mkdocs.structure.files import File

    files.append(File.generated(config, "openapi.json", content=json.dumps(_document, indent=2)))
    return files


def on_page_markdown(markdown: str, page, config, files, **kwargs) -> str:
    if MARKER in markdown:
        markdown = markdown.replace(MARKER, operations_table(_document))
    return markdown
