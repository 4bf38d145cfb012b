"""ner stages without a server: flair's tokenization and offsets, the char-LM inputs, the torch tagger,
the Viterbi decoder (against brute force and flair's own), span extraction, and model.py error isolation."""
from __future__ import annotations

import itertools
import json
import random

import numpy as np
import pytest

import fake_pb_utils
from model_configs import MODEL_REPOSITORY, load_python_model
from ner_decoder.spans import entities_json, spans_from_bioes
from ner_decoder.viterbi import ViterbiDecoder
from ner_preprocess.flair_sentence import clean_text, tokenize
from ner_preprocess.preprocessing import NerPreprocessor, check_request_size
from ner_preprocess.sentences import sentence_tokens
from ner_reference import flair_entities
from ner_tagger.rows import sentence_rows
from stage_common.errors import BadInput

TAGGER_INPUTS = ("char_ids", "sentence_chars", "sentence_tokens", "token_positions", "token_count")
LONG_TEXT = " ".join(f"In {1900 + i} the board of {org} met {person} in {city}, and nothing was decided."
                     for i, (org, person, city) in enumerate([("Siemens AG", "Angela Merkel", "Munich"),
                                                              ("Microsoft", "Bill Gates", "Seattle"),
                                                              ("the United Nations", "Kofi Annan", "New York")] * 10))

from build.ner import FLAIR_TAGGER as TAGGER_FILE  # noqa: E402 - the flair model, outside model_repository/

STRINGS = [
    "George Washington went to Washington.", "", " ", "   ", "  leading and trailing  ",
    "multiple   spaces\tand\ttabs\nnew\n\nlines", "Zoë Saldaña visited Zürich café.", "東京は日本の首都です。北京也很大。",
    "I ❤️ NY 🇺🇸 and 😀😀 emoji! 👩‍👩‍👧", "...!!!???", "can't won't don't I'm he's O'Neil's",
    "Dr. Smith met Mr. Jones at 5 p.m. in the U.S.A. yesterday.", "zero\u200bwidth\u200cchars\ufeffhere \ufe0f",
    "win\x93quoted\x94 text\x81bad\x85", "e-mail: test@example.com http://example.com/a?b=c",
    "Привет, мир! Москва — столица.", "مرحبا بالعالم", "line\u2028sep\u2029para", "a\u00a0b\u2009c",
    "First sentence. Second one! Third? Fourth.", "(parenthesis) [brackets] {braces} \"quotes\" 'single'",
    "$100,000.00 and 50% off", "e\u0301 combining accent", "x", "\u200b", "\u200b \x81 \ufeff",
]


def random_strings(count: int, seed: int = 0) -> list[str]:
    rnd = random.Random(seed)
    alphabet = "ab AB.,'\"-\t\n\u200b\x85\x81\x93é東😀\u00a0!?()\u2028"
    return ["".join(rnd.choice(alphabet) for _ in range(rnd.randint(0, 30))) for _ in range(count)]


@pytest.fixture(scope="module")
def flair_tagger():
    import torch
    from flair.models import SequenceTagger

    torch.set_num_threads(1)
    return SequenceTagger.load(TAGGER_FILE).eval()


@pytest.fixture(scope="module")
def preprocessor():
    return NerPreprocessor(MODEL_REPOSITORY / "ner_preprocess" / "1" / "char_lm.json")


@pytest.fixture(scope="module", params=["torch", "onnx"])
def runner(request):
    """Both runtimes of the tagger stage: torch, and ONNX Runtime over the graphs `make model` wrote."""
    import torch

    from ner_tagger.runtimes import make_tagger

    torch.set_num_threads(1)
    return make_tagger(MODEL_REPOSITORY / "ner_tagger" / "1", request.param, threads=1)


def tolerance(runner, torch_tolerance: float) -> float:
    """torch runs flair's own kernels; ONNX Runtime's LSTM and GEMMs sum in another order, so its figures
    differ in the last digits (the build prints the emissions' difference when it exports): ten times torch's."""
    return torch_tolerance if runner.runtime == "torch" else 10 * torch_tolerance


@pytest.fixture(scope="module")
def decoder():
    from ner_decoder.decoding import NerDecoder

    return NerDecoder(MODEL_REPOSITORY / "ner_decoder" / "1" / "crf.json")


# --- tokenization ---------------------------------------------------------------------------------

def test_tokens_and_offsets_match_flair_sentence():
    from flair.data import Sentence

    for text in STRINGS + random_strings(2000):
        sentence = Sentence(text)
        cleaned, origin = clean_text(text)
        assert cleaned == Sentence._handle_problem_characters(text)
        tokens = tokenize(text)
        assert [t.text for t in tokens] == [t.text for t in sentence], repr(text)
        assert [t.whitespace_after for t in tokens] == [t.whitespace_after for t in sentence], repr(text)
        # flair's offsets are into its cleaned text; ours map back to the original string
        assert [(origin[t.start_position], origin[t.end_position - 1] + 1) for t in sentence] == \
               [(t.start, t.end) for t in tokens], repr(text)
        for t in tokens:
            assert clean_text(text[t.start:t.end])[0] == t.text


def test_offsets_point_into_the_original_string():
    text = "a\u200bb Zürich\x93 \ufeffParis"
    assert [(t.text, text[t.start:t.end]) for t in tokenize(text)] == [
        ("ab", "a\u200bb"), ("Zürich", "Zürich"), ("\u201c", "\x93"), ("Paris", "Paris")]


def test_char_ids_match_flair_language_models(flair_tagger, preprocessor):
    from flair.data import Sentence

    lms = {("forward" if e.lm.is_forward_lm else "backward"): e for e in flair_tagger.embeddings.embeddings}
    texts = ["George Washington went to Washington.", "Zoë  Saldaña ❤️ 東京", "  x  "]
    encoded = preprocessor.encode(texts)
    for r, text in enumerate(texts):
        tokenized = Sentence(text).to_tokenized_string()
        for d, direction in enumerate(("forward", "backward")):
            lm = lms[direction].lm
            string = tokenized if lm.is_forward_lm else tokenized[::-1]
            expected = lm.dictionary.get_idx_for_items(list(f"{lm.document_delimiter}{string} "))
            count = encoded["sentence_chars"][r, 0, d]
            assert count == len(expected)
            assert encoded["char_ids"][r, d, :count].tolist() == expected


def test_preprocess_pads_rows_and_never_emits_empty_tensors(preprocessor):
    encoded = preprocessor.encode(["", "  "])
    assert encoded["token_count"].tolist() == [[0], [0]]
    assert encoded["token_positions"].shape == (2, 2, 1) and encoded["token_offsets"].shape == (2, 1, 2)
    assert encoded["char_ids"].shape == (2, 2, 1)
    # no sentence with a token: nothing for the tagger to run
    assert encoded["sentence_chars"].tolist() == [[[0, 0]], [[0, 0]]]
    assert encoded["sentence_tokens"].tolist() == [[0], [0]]


# --- tagger ---------------------------------------------------------------------------------------

def test_char_lm_embeddings_equal_flair(flair_tagger, preprocessor, runner):
    import torch
    from flair.data import Sentence

    texts = ["George Washington went to Washington.", "Zoë Saldaña visited Zürich café.", "東京は日本の首都です。",
             "I ❤️ NY 🇺🇸", "...!!!", "a", "  lead  trail  ", "word " * 150]
    enc = preprocessor.encode(texts)
    ours = runner.char_lm_embeddings(enc["char_ids"], enc["sentence_chars"][:, 0],  # one sentence each
                                     enc["token_positions"])
    with torch.no_grad():
        for r, text in enumerate(texts):
            expected, lengths = flair_tagger._prepare_tensors([Sentence(text)])
            n = int(lengths[0])
            np.testing.assert_allclose(ours[r, :n], expected[0, :n].numpy(), rtol=0, atol=tolerance(runner, 1e-6))


def test_segments_cover_every_row_to_its_end():
    from ner_tagger.segments import plan_segments

    lengths = sorted([40, 5000, 60, 38, 120, 20, 41], reverse=True)
    segments = plan_segments(lengths)
    start = 0
    for end, active in segments:
        assert end > start and active == sum(1 for n in lengths if n > start)
        start = end
    assert start == 5000 and segments[-1][1] == 1, "the long row finishes alone"
    assert plan_segments([50] * 10) == [(50, 10)]


def run_stages(preprocessor, runner, decoder, texts, chars_per_forward=16000):
    encoded = preprocessor.encode(texts)
    rows = sentence_rows(*(encoded[k] for k in TAGGER_INPUTS))
    emissions = runner.emissions_per_request([rows], chars_per_forward)[0]
    return [json.loads(row) for row in decoder.decode(texts, emissions, encoded["token_offsets"],
                                                      encoded["sentence_tokens"], encoded["token_count"])]


def assert_equal_to_flair(texts, got, expected, score_tolerance=1e-5):
    for text, entities, spans in zip(texts, got, expected):
        assert [(e["start"], e["end"], e["label"]) for e in entities] == [s[:3] for s in spans], repr(text)
        for e, span in zip(entities, spans):
            assert e["text"] == text[e["start"]:e["end"]]
            assert e["score"] == pytest.approx(span[3], abs=score_tolerance)


def test_stages_in_process_equal_flair_predict(flair_tagger, preprocessor, runner, decoder):
    """Against flair's SegtokSentenceSplitter + SequenceTagger.predict on the sentences it produces."""
    texts = STRINGS + ["Barack Obama visited Paris and London last year.",
                       "Microsoft and Google compete in the United States of America.", LONG_TEXT]
    got = run_stages(preprocessor, runner, decoder, texts)
    assert_equal_to_flair(texts, got, flair_entities(flair_tagger, texts), tolerance(runner, 1e-5))
    assert sum(len(e) for e in got) >= 5, "the demo model should find entities"


def test_sentences_split_across_forwards_give_the_same_entities(flair_tagger, preprocessor, runner, decoder):
    """A small chars_per_forward cuts one request's sentences into many forward passes: same result."""
    texts = [LONG_TEXT, "George Washington went to Washington. Angela Merkel met Barack Obama in Berlin."]
    got = run_stages(preprocessor, runner, decoder, texts, chars_per_forward=300)
    assert_equal_to_flair(texts, got, flair_entities(flair_tagger, texts), tolerance(runner, 1e-5))


def test_sentences_are_flair_splitter_sentences_with_original_offsets():
    from flair.splitter import SegtokSentenceSplitter

    for text in STRINGS + [LONG_TEXT, "One. Two!  Three?\n\nFour \u200bfive. ", "A\x93b. C d."]:
        ours = sentence_tokens(text)
        theirs = [s for s in SegtokSentenceSplitter().split(text) if len(s)]
        assert [[t.text for t in tokens] for tokens in ours] == [[t.text for t in s] for s in theirs], repr(text)
        for tokens in ours:
            for t in tokens:
                assert clean_text(text[t.start:t.end])[0] == t.text


def test_request_and_sentence_limits_are_refused_naming_them(preprocessor):
    assert check_request_size(["a" * 600, "b" * 400], 1000) == ["a" * 600, "b" * 400]
    with pytest.raises(BadInput, match=r"1001, over the limit of 1000 \(model parameter max_request_characters\)"):
        check_request_size(["a" * 600, "b" * 401], 1000)
    bounded = NerPreprocessor(MODEL_REPOSITORY / "ner_preprocess" / "1" / "char_lm.json", max_sentence_characters=50)
    bounded.encode(["Short one. " * 20])  # many short sentences: fine
    with pytest.raises(BadInput, match=r"sentence 1 of 'text' row 0 .*max_sentence_characters"):
        bounded.encode(["Short one. " + "word " * 20])


# --- decoder --------------------------------------------------------------------------------------

def brute_force(emissions, transitions, start, stop):
    length, tags = emissions.shape
    best, best_path = -np.inf, None
    for path in itertools.product(range(tags), repeat=length):
        score = transitions[path[0], start] + emissions[0, path[0]] + transitions[stop, path[-1]]
        for t in range(1, length):
            score += transitions[path[t], path[t - 1]] + emissions[t, path[t]]
        if score > best:
            best, best_path = score, list(path)
    return best_path


def random_crf(rng, tags):
    transitions = rng.normal(size=(tags, tags)).astype(np.float32)
    start, stop = tags - 2, tags - 1
    transitions[start, :] = -10000  # as flair's CRF: nothing goes to START, nothing leaves STOP
    transitions[:, stop] = -10000
    return transitions, start, stop


def test_viterbi_equals_brute_force_on_small_random_cases():
    rng = np.random.default_rng(0)
    for _ in range(200):
        tags, length = int(rng.integers(3, 7)), int(rng.integers(1, 6))
        transitions, start, stop = random_crf(rng, tags)
        emissions = (rng.normal(size=(length, tags)) * 2).astype(np.float32)
        path, confidences = ViterbiDecoder(transitions, start, stop).decode(emissions)
        assert path == brute_force(emissions.astype(np.float64), transitions.astype(np.float64), start, stop)
        assert len(confidences) == length and all(0 < c <= 1 for c in confidences)


def test_viterbi_equals_flair_decoder_paths_and_confidences():
    import torch
    from flair.data import Dictionary
    from flair.models.sequence_tagger_utils.viterbi import ViterbiDecoder as FlairViterbi

    rng = np.random.default_rng(1)
    labels = Dictionary(add_unk=False)
    for tag in ["O", "S-PER", "B-PER", "E-PER", "I-PER", "S-LOC"]:
        labels.add_item(tag)
    labels.set_start_stop_tags()
    tags = len(labels)
    transitions, start, stop = random_crf(rng, tags)
    assert (start, stop) == (labels.get_idx_for_item("<START>"), labels.get_idx_for_item("<STOP>"))
    lengths = sorted(rng.integers(1, 12, size=9).tolist(), reverse=True)  # flair sorts longest first
    emissions = (rng.normal(size=(len(lengths), max(lengths), tags)) * 3).astype(np.float32)
    features = torch.from_numpy(emissions).unsqueeze(-1) + torch.from_numpy(transitions)
    expected, _ = FlairViterbi(labels).decode((features, torch.tensor(lengths), torch.from_numpy(transitions)),
                                              False, [None] * len(lengths))
    ours = ViterbiDecoder(transitions, start, stop)
    for row, length in enumerate(lengths):
        path, confidences = ours.decode(emissions[row, :length])
        assert [labels.get_item_for_index(i) for i in path] == [tag for tag, _ in expected[row]]
        np.testing.assert_allclose(confidences, [c for _, c in expected[row]], rtol=0, atol=1e-6)


def test_spans_equal_flair_get_spans_from_bio():
    from flair.data import get_spans_from_bio

    rng = random.Random(0)
    vocab = ["O", "_", ""] + [f"{p}-{t}" for p in "BIES" for t in ("PER", "LOC", "ORG", "MISC")]
    cases = [["B-PER", "E-PER", "O", "S-LOC"], ["I-ORG", "I-ORG"], ["B-PER", "I-LOC", "E-PER"], [], ["S-MISC"]]
    cases += [[rng.choice(vocab) for _ in range(rng.randint(0, 10))] for _ in range(3000)]
    for tags in cases:
        scores = [rng.random() for _ in tags]
        assert spans_from_bioes(tags, scores) == get_spans_from_bio(list(tags), list(scores)), tags


def test_entities_json_slices_the_original_text():
    text = "  New\tYork  and Paris"
    offsets = [(2, 5), (6, 10), (12, 15), (16, 21)]
    out = json.loads(entities_json(text, offsets, [([3], 0.5, "LOC"), ([0, 1], 0.75, "LOC")]))
    assert out == [{"text": "New\tYork", "label": "LOC", "start": 2, "end": 10, "score": 0.75},
                   {"text": "Paris", "label": "LOC", "start": 16, "end": 21, "score": 0.5}]
    assert entities_json(text, offsets, []) == "[]"


# --- model.py: every bad request fails alone ------------------------------------------------------

def text_request(*texts):
    return fake_pb_utils.InferenceRequest({"text": np.array([[t if isinstance(t, bytes) else t.encode()]
                                                              for t in texts], dtype=object)})


def test_preprocess_model_isolates_bad_requests():
    model = load_python_model("ner_preprocess")
    responses = model.execute([text_request("George went home.", ""), text_request(b"caf\xe9 latin-1"),
                               text_request("x" * 5_001), text_request("fine"), text_request("word " * 300)])
    assert not responses[0].has_error() and not responses[3].has_error()
    assert responses[0].output("token_count").tolist() == [[4], [0]]
    assert responses[1].error().code() == fake_pb_utils.TritonError.INVALID_ARG
    assert "not valid UTF-8" in responses[1].error().message()
    assert responses[2].error().code() == fake_pb_utils.TritonError.INVALID_ARG
    assert "5001, over the limit of 5000 (model parameter max_request_characters)" in responses[2].error().message()
    assert responses[4].error().code() == fake_pb_utils.TritonError.INVALID_ARG
    assert "max_sentence_characters" in responses[4].error().message()


def test_tagger_and_decoder_models_isolate_bad_requests(preprocessor):
    good = preprocessor.encode(["George Washington went to Washington.", ""])
    tagger = load_python_model("ner_tagger")
    bad = dict(good, token_count=np.array([[99], [0]], dtype=np.int64))
    outside = dict(good, token_positions=good["token_positions"] + 1000)
    responses = tagger.execute([fake_pb_utils.InferenceRequest({k: r[k] for k in TAGGER_INPUTS})
                                for r in (good, bad, outside)])
    assert not responses[0].has_error()
    emissions = responses[0].output("emissions")
    assert emissions.shape == (2, 6, 19) and emissions.dtype == np.float32
    assert responses[1].error().code() == fake_pb_utils.TritonError.INVALID_ARG
    assert responses[2].error().code() == fake_pb_utils.TritonError.INVALID_ARG

    decoder = load_python_model("ner_decoder")
    inputs = {"text": np.array([[b"George Washington went to Washington."], [b""]], dtype=object),
              "emissions": emissions, "token_offsets": good["token_offsets"],
              "sentence_tokens": good["sentence_tokens"], "token_count": good["token_count"]}
    responses = decoder.execute([fake_pb_utils.InferenceRequest(inputs),
                                 fake_pb_utils.InferenceRequest(dict(inputs, emissions=emissions[:1]))])
    rows = [json.loads(v) for v in responses[0].output("entities").reshape(-1)]
    assert rows[1] == [] and all(isinstance(e["score"], float) for e in rows[0])
    assert responses[1].error().code() == fake_pb_utils.TritonError.INVALID_ARG


def test_tagger_bounds_hold_for_direct_callers_and_never_refuse_what_preprocess_accepts():
    """ner_tagger is callable on its own: its bounds (in char-LM steps) refuse more than ner_preprocess's
    limits can produce, and never less: the worst cases preprocess accepts pass."""
    tagger, shipped = load_python_model("ner_tagger"), load_python_model("ner_preprocess")
    worst = ["a! " * 1666, "a!b!" * 1250, "a , b " * 833, ("x," * 498 + "x. ") * 5, "a. " * 1666,
             "\u200ba! " * 1250, "I ! " * 1250, "Go! " * 1250]
    ratios = []
    for text in worst:
        assert len(text) <= 5000
        try:
            encoded = shipped.preprocessor.encode(check_request_size([text], shipped.max_request_characters))
        except BadInput:
            continue
        rows = tagger._parse(fake_pb_utils.InferenceRequest({k: encoded[k] for k in TAGGER_INPUTS}))  # accepted
        ratios.append(sum(len(s.char_ids[0]) for s in rows.sentences) / len(text))
    assert len(ratios) >= 3 and max(ratios) > 1.6, ratios  # costly cases were among them
    unbounded = NerPreprocessor(MODEL_REPOSITORY / "ner_preprocess" / "1" / "char_lm.json")
    long_sentence = unbounded.encode(["word " * 420])  # 2,100 characters: ner_preprocess refuses it
    with pytest.raises(BadInput, match="max_sentence_lm_characters"):
        tagger._parse(fake_pb_utils.InferenceRequest({k: long_sentence[k] for k in TAGGER_INPUTS}))
    many = unbounded.encode(["Short sentence here. " * 800])  # 16,800 characters
    with pytest.raises(BadInput, match="max_request_lm_characters"):
        tagger._parse(fake_pb_utils.InferenceRequest({k: many[k] for k in TAGGER_INPUTS}))
