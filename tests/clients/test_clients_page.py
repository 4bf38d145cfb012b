"""docs/clients.md holds the snippets the clients tier runs (tests/clients/test_clients_server.py): one
embeddings and one completions block per client, each naming the documented gateway address once."""
from __future__ import annotations

import pytest

from page_snippets import CLIENTS, DOCUMENTED_URL, EXTRA, pointed_at, snippets


def test_every_client_has_its_embeddings_and_completions_snippet():
    assert sorted(snippets()) == sorted([f"{c}_{kind}.py" for c in CLIENTS for kind in ("embeddings", "completions")]
                                        + EXTRA)


@pytest.mark.parametrize("title", sorted(snippets()))
def test_each_snippet_compiles_and_points_at_the_gateway_once(title):
    code = pointed_at(snippets()[title], "http://127.0.0.1:1")
    assert DOCUMENTED_URL not in code and 'BASE_URL = "http://127.0.0.1:1/v1"' in code
    compile(code, title, "exec")


def test_langchain_embeddings_send_text():
    """The fix the gateway's token-id refusal names is the one the page uses."""
    assert "check_embedding_ctx_length=False" in snippets()["langchain_embeddings.py"]


def test_pointed_at_refuses_a_snippet_without_the_address(tmp_path):
    with pytest.raises(ValueError):
        pointed_at("print(1)", "http://127.0.0.1:1")
    page = tmp_path / "page.md"
    page.write_text('```python title="a.py"\nx = 1\n```\n\n```python title="a.py"\nx = 2\n```\n')
    with pytest.raises(ValueError, match="two blocks"):
        snippets(page)
