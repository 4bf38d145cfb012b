"""The code blocks of docs/clients.md that the clients tier runs: every ```python block with a title, as
written on the page (one source of truth: the page shows what the tests run)."""
from __future__ import annotations

import re
from pathlib import Path

PAGE = Path(__file__).resolve().parents[2] / "docs" / "clients.md"
CLIENTS = ["openai", "langchain", "llamaindex", "litellm"]  # each has an embeddings and a completions block
EXTRA = ["openai_logprobs.py"]  # scoring and logprobs with the OpenAI SDK
DOCUMENTED_URL = "http://localhost:8080"  # the address the snippets use; the tests put a live gateway's there
_BLOCK = re.compile(r'^```python title="([\w.]+)"\n(.*?)^```$', re.MULTILINE | re.DOTALL)


def snippets(page: Path = PAGE) -> dict[str, str]:
    """title -> code of every titled python block, in page order."""
    found: dict[str, str] = {}
    for title, code in _BLOCK.findall(page.read_text(encoding="utf-8")):
        if title in found:
            raise ValueError(f"{page.name}: two blocks titled {title}")
        found[title] = code
    return found


def pointed_at(code: str, url: str) -> str:
    """The snippet with its one documented gateway address replaced by `url`."""
    if code.count(DOCUMENTED_URL) != 1:
        raise ValueError(f"a snippet must name {DOCUMENTED_URL} exactly once (as BASE_URL), not "
                         f"{code.count(DOCUMENTED_URL)} times")
    return code.replace(DOCUMENTED_URL, url)
