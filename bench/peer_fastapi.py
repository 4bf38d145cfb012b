"""The peer a user would write instead of this package: FastAPI + uvicorn with the model in-process
(one process, torch threads = cores), one endpoint per pipeline. `make bench` starts it on a free port
and loads it exactly like the served pipelines, in the same run.

    python -m bench.peer_fastapi --port 9100 --pipeline text_embedding
"""
from __future__ import annotations

import argparse
import base64
import io
import os
from pathlib import Path

from fastapi import FastAPI
from pydantic import BaseModel

ROOT = Path(__file__).resolve().parent.parent

MODEL_REPOSITORY = ROOT / "model_repository"


class Texts(BaseModel):
    texts: list[str]


class Images(BaseModel):
    images: list[str]  # base64


def text_embedding_app() -> FastAPI:
    from sentence_transformers import SentenceTransformer

    model = SentenceTransformer(str(MODEL_REPOSITORY / "text_embedding_encoder" / "1"), device="cpu")
    app = FastAPI()

    @app.post("/embed")
    def embed(body: Texts):  # a plain def: FastAPI runs it in its thread pool, as users write it
        return {"embeddings": model.encode(body.texts, normalize_embeddings=True).tolist()}

    return app


def ner_app() -> FastAPI:
    from flair.data import Sentence
    from flair.models import SequenceTagger

    from build.ner import FLAIR_TAGGER

    tagger = SequenceTagger.load(str(FLAIR_TAGGER))
    app = FastAPI()

    @app.post("/ner")
    def ner(body: Texts):
        sentences = [Sentence(t) for t in body.texts]
        tagger.predict(sentences, mini_batch_size=32)
        return {"entities": [[{"text": s.text, "label": s.tag, "start": s.start_position, "end": s.end_position,
                               "score": s.score} for s in sentence.get_spans("ner")] for sentence in sentences]}

    return app


def food_captioning_app() -> FastAPI:
    import torch
    from PIL import Image
    from transformers import (AutoImageProcessor, AutoModelForImageClassification, BlipForConditionalGeneration,
                              BlipProcessor)

    cls_dir = MODEL_REPOSITORY / "food_captioning_classifier" / "1"
    cap_dir = MODEL_REPOSITORY / "food_captioning_captioner" / "1"
    classifier = AutoModelForImageClassification.from_pretrained(str(cls_dir)).eval()
    cls_processor = AutoImageProcessor.from_pretrained(str(cls_dir), use_fast=False)
    captioner = BlipForConditionalGeneration.from_pretrained(str(cap_dir)).eval()
    cap_processor = BlipProcessor.from_pretrained(str(cap_dir), use_fast=False)
    from bench.model_repo import parameter  # the served captioner's decoding settings, so both do the same work

    template = parameter("food_captioning_captioner", "prompt_template")
    max_new_tokens = int(parameter("food_captioning_captioner", "max_new_tokens"))
    num_beams = int(parameter("food_captioning_captioner", "num_beams"))
    app = FastAPI()

    @app.post("/caption")
    def caption(body: Images):
        images = [Image.open(io.BytesIO(base64.b64decode(b))).convert("RGB") for b in body.images]
        with torch.inference_mode():
            logits = classifier(**cls_processor(images=images, return_tensors="pt")).logits
            probs = logits.softmax(-1)
            labels = [classifier.config.id2label[int(i)] for i in probs.argmax(-1)]
            prompts = [template.format(label=label) for label in labels]
            inputs = cap_processor(images=images, text=prompts, return_tensors="pt", padding=True)
            out = captioner.generate(**inputs, max_new_tokens=max_new_tokens, num_beams=num_beams)
        captions = cap_processor.batch_decode(out, skip_special_tokens=True)
        return {"results": [{"label": l, "score": float(p.max()), "caption": c}
                            for l, p, c in zip(labels, probs, captions)]}

    return app


APPS = {"text_embedding": (text_embedding_app, "/embed"), "ner": (ner_app, "/ner"),
        "food_captioning": (food_captioning_app, "/caption")}


def main() -> None:
    import torch
    import uvicorn

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--pipeline", choices=sorted(APPS), required=True)
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    uvicorn.run(APPS[args.pipeline][0](), host="127.0.0.1", port=args.port, log_level="warning")


if __name__ == "__main__":
    main()
