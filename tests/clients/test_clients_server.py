"""The clients people already use, against a live gateway (issue 44): the OpenAI SDK, LangChain, LlamaIndex
and LiteLLM, each at its latest version in a venv of its own (.clients-venv, tools/clients_venv.sh), run
the snippets of docs/clients.md as written there, pointed at this session's gateway. What each client got
is compared with the gateway's own answers, and no client process may reach past 127.0.0.1
(loopback_only/sitecustomize.py records any try; with the documented settings there is none)."""
from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path

import numpy as np
import pytest

from gateway_helpers import MINILM
from page_snippets import CLIENTS, pointed_at, snippets

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve().parent
VENV_PYTHON = ROOT / ".clients-venv" / "bin" / "python"
# what the snippets embed and complete (the page's texts: a change there shows here as a mismatch)
DOCUMENTS, QUERY = ["The cat sat on the mat.", "A dog barked."], "Where did the cat sit?"
PROMPT, MAX_TOKENS = "def fibonacci(n):", 24


@pytest.fixture(scope="module")
def clients_python() -> Path:
    """.clients-venv, made on first use (a fresh clone: minutes; the time is printed) and reused while
    tests/clients/requirements.txt is unchanged."""
    started = time.perf_counter()
    subprocess.run(["bash", str(ROOT / "tools" / "clients_venv.sh")], check=True, timeout=1200)
    print(f"\n.clients-venv ready in {time.perf_counter() - started:.1f} s")
    return VENV_PYTHON


@pytest.fixture(scope="module")
def served(gateway):
    gateway.triton.load("text_embedding", "codegen_generator", "codegen", "codegen_stream")
    return gateway


def client_env(tmp_path: Path) -> tuple[dict, Path]:
    """A client process's environment: loopback only, no OpenAI key, an empty tiktoken cache."""
    blocked = tmp_path / "blocked.log"
    for folder in ("home", "tiktoken"):
        (tmp_path / folder).mkdir(exist_ok=True)
    return {"PATH": f"{VENV_PYTHON.parent}:/usr/bin:/bin", "HOME": str(tmp_path / "home"),
            "PYTHONPATH": str(HERE / "loopback_only"), "CLIENTS_BLOCKED_LOG": str(blocked),
            "TIKTOKEN_CACHE_DIR": str(tmp_path / "tiktoken"), "HF_ENDPOINT": os.environ["HF_ENDPOINT"],
            "HF_HUB_OFFLINE": "1", "NO_COLOR": "1"}, blocked


def run_snippet(python: Path, title: str, url: str, tmp_path: Path) -> dict:
    script, out = tmp_path / title, tmp_path / "results.json"
    script.write_text(pointed_at(snippets()[title], url), encoding="utf-8")
    env, blocked = client_env(tmp_path)
    started = time.perf_counter()
    done = subprocess.run([str(python), str(HERE / "run_snippet.py"), str(script), str(out)], env=env,
                          cwd=tmp_path, capture_output=True, text=True, timeout=300)
    print(f"\n{title}: {time.perf_counter() - started:.1f} s")
    assert done.returncode == 0, f"{title} failed:\n{done.stdout[-2000:]}\n{done.stderr[-6000:]}"
    tries = blocked.read_text() if blocked.exists() else ""
    assert tries == "", f"{title} reached for the network beyond loopback:\n{tries}"
    return json.loads(out.read_text())


def test_the_guard_refuses_and_records_outside_addresses(clients_python, tmp_path):
    """The no-network assertion means something: the guard is loaded and records a lookup."""
    env, blocked = client_env(tmp_path)
    probe = ("import socket\ntry:\n    socket.getaddrinfo('example.com', 443)\nexcept OSError:\n    print('refused')\n"
             "s = socket.socket(); print(s.connect_ex(('192.0.2.1', 9)))")
    done = subprocess.run([str(clients_python), "-c", probe], env=env, capture_output=True, text=True, timeout=60)
    assert done.stdout.split() == ["refused", "111"], done.stdout + done.stderr
    assert blocked.read_text().split("\n")[:2] == ["lookup example.com", "connect 192.0.2.1"]


@pytest.mark.parametrize("client", CLIENTS)
def test_embeddings_equal_the_gateways_own(served, clients_python, tmp_path, client):
    got = run_snippet(clients_python, f"{client}_embeddings.py", served.url, tmp_path)
    reference = served.http.post("/v1/embeddings", json={"model": MINILM, "input": [*DOCUMENTS, QUERY]})
    assert reference.status_code == 200, reference.text
    expected = np.array([d["embedding"] for d in reference.json()["data"]], dtype=np.float32)
    vectors = np.array(got["vectors"], dtype=np.float32)
    assert vectors.shape == (2, 384)
    np.testing.assert_allclose(vectors, expected[:2], atol=1e-6)  # the texts were sent, not token ids
    np.testing.assert_allclose(np.array(got["query_vector"], dtype=np.float32), expected[2], atol=1e-6)


@pytest.mark.parametrize("client", CLIENTS)
def test_completions_and_streams_equal_the_gateways_own(served, clients_python, tmp_path, client):
    got = run_snippet(clients_python, f"{client}_completions.py", served.url, tmp_path)
    reference = served.http.post("/v1/completions", json={"model": "codegen", "prompt": PROMPT,
                                                          "max_tokens": MAX_TOKENS, "temperature": 0})
    assert reference.status_code == 200, reference.text
    expected = reference.json()["choices"][0]["text"]
    assert expected.strip(), "the greedy completion is empty: nothing to compare"
    assert got["text"] == expected
    assert got["streamed"] == expected


def test_openai_sdk_scores_and_reads_logprobs_as_the_gateway_answers(served, clients_python, tmp_path):
    """The page's scoring snippet (echo, logprobs, max_tokens 0) and top logprobs, read by the OpenAI SDK."""
    got = run_snippet(clients_python, "openai_logprobs.py", served.url, tmp_path)
    scored = served.http.post("/v1/completions", json={
        "model": "codegen", "prompt": ["def add(a, b):\n    return a + b"], "max_tokens": 0, "echo": True,
        "logprobs": 1, "temperature": 0}).json()["choices"][0]["logprobs"]
    assert got["tokens"] == scored["tokens"] and got["token_logprobs"] == scored["token_logprobs"]
    assert got["token_logprobs"][0] is None and all(lp < 0 for lp in got["token_logprobs"][1:])
    top = served.http.post("/v1/completions", json={"model": "codegen", "prompt": "def fibonacci(n):", "max_tokens": 8,
                                                    "temperature": 0, "logprobs": 3}).json()["choices"][0]["logprobs"]
    assert got["top_logprobs"] == top["top_logprobs"] and all(3 <= len(t) <= 4 for t in got["top_logprobs"])
