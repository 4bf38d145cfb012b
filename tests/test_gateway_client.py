"""client/embed.py --gateway: texts through /v1/embeddings (base64), images through /infer, loading on request."""
from __future__ import annotations

import numpy as np
import pytest

from embed import embed_gateway, main
from gateway_helpers import CLIP_DEMO, MINILM, clip_image_features, clip_text_features, png_bytes

pytestmark = pytest.mark.integration


def test_embed_client_through_the_gateway(gateway, tmp_path, capsys, monkeypatch):
    gateway.triton.load("text_embedding")
    texts = ["a red square", "a green stripe"]
    text, image = embed_gateway(gateway.url, MINILM, texts, [])
    assert text.shape == (2, 384) and image.shape == (0, 384)
    np.testing.assert_allclose(np.linalg.norm(text, axis=1), 1, atol=1e-5)
    direct = gateway.http.post("/v1/embeddings", json={"model": MINILM, "input": texts}).json()["data"]
    np.testing.assert_allclose(text, [d["embedding"] for d in direct], atol=1e-6)

    picture = tmp_path / "red.png"
    picture.write_bytes(png_bytes((90, 70), (220, 20, 20), pattern=3))
    text, image = embed_gateway(gateway.url, CLIP_DEMO, texts, [picture], load=True)
    np.testing.assert_allclose(text, clip_text_features(texts), atol=1e-5)
    np.testing.assert_allclose(image, clip_image_features([picture.read_bytes()]), atol=1e-5)

    monkeypatch.setattr("sys.argv", ["embed.py", "a red square", "--gateway", gateway.url, "--model", CLIP_DEMO,
                                     "--image", str(picture)])
    assert main() == 0
    out = capsys.readouterr().out
    assert "image red.png" in out and "[0] vs [1]" in out
    monkeypatch.setattr("sys.argv", ["embed.py", "x", "--gateway", gateway.url, "--model", "no/such-model"])
    assert main() == 1
    assert "no/such-model" in capsys.readouterr().err
