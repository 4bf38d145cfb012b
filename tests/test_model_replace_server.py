"""Model update without downtime on a live gateway: a registered model's weights change on disk and it is
registered again with `"replace": true` while 16 clients embed with it. No request fails, every answer is
the old model's or the new one's, and once the replace has answered every answer is the new one's."""
from __future__ import annotations

import shutil
import threading
import time

import numpy as np
import pytest

from model_configs import ROOT

pytestmark = pytest.mark.integration
TEXT = ["a steady load sentence"]


def perturb_weights(folder):
    """New weights of the same shape: every floating tensor scaled and shifted a little."""
    from safetensors.numpy import load_file, save_file

    tensors = load_file(folder / "model.safetensors")
    rng = np.random.default_rng(0)
    changed = {k: (v * 1.5 + rng.normal(0, 0.05, v.shape)).astype(v.dtype) if v.dtype.kind == "f" else v
               for k, v in tensors.items()}
    save_file(changed, folder / "model.safetensors")


def test_replace_under_load_drops_no_request(gateway, extra_model_root):
    folder = extra_model_root / "replace-demo"
    if folder.exists():
        shutil.rmtree(folder)
    shutil.copytree(ROOT / "demo_models" / "st-cls-demo", folder)
    name = str(folder)
    http = gateway.http
    r = http.post("/load_sentence_transformer_model", json={"model_name": name})
    assert r.status_code == 200, r.text

    def embed(client) -> np.ndarray:
        response = client.post("/v1/embeddings", json={"model": name, "input": TEXT})
        assert response.status_code == 200, response.text
        return np.array(response.json()["data"][0]["embedding"])

    old = embed(http)
    perturb_weights(folder)
    answers: list[tuple[float, float, np.ndarray | str]] = []
    stop = threading.Event()

    def client():
        import httpx

        with httpx.Client(base_url=gateway.url, timeout=120) as c:
            while not stop.is_set():
                start = time.time()
                try:
                    response = c.post("/v1/embeddings", json={"model": name, "input": TEXT})
                    result = (np.array(response.json()["data"][0]["embedding"]) if response.status_code == 200
                              else f"{response.status_code}: {response.text[:200]}")
                except Exception as exc:  # noqa: BLE001 - recorded as a failure
                    result = f"{type(exc).__name__}: {exc}"
                answers.append((start, time.time(), result))

    threads = [threading.Thread(target=client, daemon=True) for _ in range(16)]
    try:
        for thread in threads:
            thread.start()
        time.sleep(2)
        replace_started = time.time()
        r = http.post("/load_sentence_transformer_model", json={"model_name": name, "replace": True})
        replaced_at = time.time()
        assert r.status_code == 200 and "replaced" in r.json()["message"], r.text
        time.sleep(3)
    finally:
        stop.set()
        for thread in threads:
            thread.join(120)
    new = embed(http)
    try:
        assert not np.allclose(new, old, atol=1e-3), "the new weights give the same embedding"
        failed = [a for a in answers if isinstance(a[2], str)]
        assert not failed, failed[:3]
        kinds = []
        for start, end, vector in answers:
            is_old, is_new = np.allclose(vector, old, atol=1e-4), np.allclose(vector, new, atol=1e-4)
            assert is_old or is_new, "an answer from neither version"
            kinds.append("new" if is_new else "old")
            if start > replaced_at:
                assert is_new, f"an old answer {start - replaced_at:.2f}s after the replace answered"
        print(f"\nreplace under load (16 clients): {len(answers)} requests, 0 failed; "
              f"{kinds.count('old')} answered by the old weights, {kinds.count('new')} by the new; "
              f"the replace took {replaced_at - replace_started:.1f}s")
        loaded = [m for m in http.get("/loaded_models").json()["models"] if m["model_name"] == name]
        assert len(loaded) == 1
    finally:
        http.post("/delete_model", json={"model_name": name})
