"""Live-server tier: the ner ensemble through a real tritonserver, against flair's SequenceTagger.predict
on the same saved model, run on the sentences flair's SegtokSentenceSplitter makes of each text."""
from __future__ import annotations

import json
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException

from model_configs import MODEL_REPOSITORY
from string_tensors import string_rows
from triton_fixtures import assert_invalid_argument, concurrently
from ner_reference import flair_entities

pytestmark = pytest.mark.integration

PARAGRAPH = " ".join(
    f"In {1900 + i} the committee of {name} met in {city} to discuss the report of {person}, and nothing was decided."
    for i, (name, city, person) in enumerate(
        [("the European Union", "Brussels", "Angela Merkel"), ("Microsoft", "Seattle", "Bill Gates"),
         ("the United Nations", "New York", "Kofi Annan"), ("Siemens AG", "Munich", "Werner von Siemens")] * 12))
PARAGRAPH = PARAGRAPH[:5000]

SENTENCES = [
    "George Washington went to Washington.", "Barack Obama visited Paris and London last year.",
    "Apple Inc. is based in Cupertino, California.", "The European Union met in Brussels on Monday with Angela Merkel.",
    "Microsoft and Google compete in the United States of America.", "I like bread.",
    "Der Bundestag tagt in Berlin.", "She said: \"Hello, world!\"", "Dr. Smith met Mr. Jones at 5 p.m. in the U.S.A.",
    "Zoë Saldaña visited Zürich and the Café de Flore in Paris.", "François Hollande and José Mourinho met in Lisboa.",
    "Ångström, Øresund and Þórr are Nordic names.", "Łódź is a city in Poland.", "Dvořák wrote the New World Symphony.",
    "Владимир Путин прибыл в Москву.", "Ο Αλέξανδρος ήταν βασιλιάς της Μακεδονίας.", "مرحبا بالعالم من القاهرة",
    "שלום ירושלים", "東京は日本の首都です。", "北京是中国的首都。", "서울은 한국의 수도입니다.", "Tokyo 東京 and Beijing 北京 are capitals.",
    "I ❤️ New York 🇺🇸 and Paris 🇫🇷!", "😀😀😀", "Elon Musk 🚀 launched Starship from Texas.", "👩‍👩‍👧 family trip to Rome",
    "...!!!???", "---", "()[]{}", "\"'", "   George Washington   ", "\tLondon\tcalling\t", "\n\nParis in spring\n\n",
    "New   York    City", "Angela  Merkel   met\tEmmanuel\nMacron.", "x", "A", "NASA", "IBM, HP and Intel.",
    "Mr. O'Neil can't come to St. John's today.", "The U.N. Security Council met in Geneva, Switzerland.",
    "He moved from Berlin to Madrid, then to Rome.", "Amazon.com and eBay.com sell books.",
    "The Rolling Stones played at Wembley Stadium in London.", "Manchester United beat Real Madrid 3-1.",
    "zero\u200bwidth\u200cjoiners\ufeffin Berlin", "win\x93quoted\x94 Paris",
    "Mixed 123 numbers 4.5 and 6,000 dollars.",
    "First sentence about London. Second one about Paris! Third about Rome? Fourth about Tokyo.",
    "Peter Parker works at the Daily Bugle. Mary Jane lives in Queens. They met in New York City.",
    "e\u0301cole in Montre\u0301al", "The Nile flows through Egypt and Sudan.",
    PARAGRAPH,
]


@pytest.fixture(scope="module")
def server(triton):
    triton.load("ner")
    return triton


@pytest.fixture(scope="module")
def reference():
    import torch
    from flair.models import SequenceTagger

    torch.set_num_threads(1)
    from build.ner import FLAIR_TAGGER

    return SequenceTagger.load(FLAIR_TAGGER).eval()


def expected_entities(tagger, texts: list[str]) -> list[list[tuple]]:
    """flair's SegtokSentenceSplitter + SequenceTagger.predict on its sentences, offsets into the original."""
    return flair_entities(tagger, texts)


def infer(url, texts) -> list[list[dict]]:
    result = grpcclient.InferenceServerClient(url).infer("ner", [string_rows("text", texts)])
    rows = result.as_numpy("entities")
    assert rows.shape == (len(texts), 1)
    return [json.loads(v.decode("utf-8")) for v in rows.reshape(-1)]


def assert_same(texts, served, expected):
    for text, entities, spans in zip(texts, served, expected):
        assert [(e["start"], e["end"], e["label"]) for e in entities] == [s[:3] for s in spans], repr(text[:80])
        for e, span in zip(entities, spans):
            assert e["text"] == text[e["start"]:e["end"]]
            assert abs(e["score"] - span[3]) < 1e-4, (text[:80], e, span)
        assert [e["start"] for e in entities] == sorted(e["start"] for e in entities)


def test_served_entities_equal_flair_predict(server, reference):
    assert len(SENTENCES) >= 50 and len(PARAGRAPH) == 5000
    # the paragraph alone: with the others it would exceed max_request_characters (5,000 in all)
    served = infer(server.grpc_url, SENTENCES[:-1]) + infer(server.grpc_url, [PARAGRAPH])
    expected = expected_entities(reference, SENTENCES)
    assert_same(SENTENCES, served, expected)
    assert sum(len(s) for s in expected) >= 20 and len({e["label"] for row in served for e in row}) >= 3, \
        "the demo model should find entities of several types"


def test_single_request_and_batch_of_64(server, reference):
    texts = [f"Sentence {i}: {SENTENCES[i % 49]}" for i in range(64)]
    expected = expected_entities(reference, texts)
    assert_same(texts[:1], infer(server.grpc_url, texts[:1]), expected[:1])
    assert_same(texts, infer(server.grpc_url, texts), expected)


def test_concurrent_clients_get_their_own_rows_and_the_tagger_batches(server, reference):
    texts = [f"Client {i} says: {SENTENCES[(i * 7) % 49]}" for i in range(32)]
    expected = expected_entities(reference, texts)
    before = server.stats("ner_tagger")
    with ThreadPoolExecutor(32) as pool:
        served = list(pool.map(lambda t: infer(server.grpc_url, [t])[0], texts))
    assert_same(texts, served, expected)
    # the tagger answers before its execution ends (merge window), so its statistics can trail a moment
    deadline = time.monotonic() + 10
    while True:
        after = server.stats("ner_tagger")
        inferences = after.inference_count - before.inference_count
        executions = after.execution_count - before.execution_count
        if inferences >= 32 or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    assert inferences == 32
    assert executions < inferences, "the dynamic batcher never grouped requests on the tagger"


def test_invalid_utf8_fails_only_its_own_request(server, reference):
    texts = [f"Request {i} from Paris to Berlin." for i in range(15)]
    jobs = texts[:7] + [b"caf\xe9 in Paris"] + texts[7:]
    results = concurrently(lambda text: infer(server.grpc_url, [text])[0], jobs)
    assert_invalid_argument(results.pop(7), "not valid UTF-8")
    assert_same(texts, results, expected_entities(reference, texts))


def test_empty_and_blank_texts_give_no_entities(server):
    assert infer(server.grpc_url, [""]) == [[]]
    assert infer(server.grpc_url, ["", "   ", "\n\t", "\u200b"]) == [[], [], [], []]


def test_text_over_the_limit_is_refused_naming_it_and_server_keeps_serving(server, reference):
    with pytest.raises(InferenceServerException) as raised:
        infer(server.grpc_url, ["ok", "x" * 10_000])
    assert "StatusCode.INVALID_ARGUMENT" in str(raised.value.status())
    assert "10002, over the limit of 5000 (model parameter max_request_characters)" in raised.value.message()
    texts = ["George Washington went to Washington."]
    assert_same(texts, infer(server.grpc_url, texts), expected_entities(reference, texts))
