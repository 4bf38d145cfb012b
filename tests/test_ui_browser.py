"""Issue 30: the gateway's /ui page in headless Debian chromium (Playwright, network limited to 127.0.0.1)
against the live gateway and Triton: index generated images by dropping them, search by text and by image,
run each pipeline panel, show the API's error message, fit a phone-sized window, work from the keyboard.
Every figure the page shows is checked against the same request sent to the API directly. Screenshots go
to the test's folder, or to $UI_SCREENSHOTS_DIR (docs/assets/ui for the docs' pictures)."""
from __future__ import annotations

import base64
import os
import sys
from pathlib import Path

import pytest

from browser import RequestLog, launch_local, local_browser
from gateway_helpers import CLIP_DEMO, png_bytes
from model_configs import ROOT

sys.path.insert(0, str(ROOT / "client"))
from search import demo_image, encode  # noqa: E402

pytestmark = pytest.mark.integration
COLLECTION = "ui-test"
N_IMAGES = 24


@pytest.fixture(scope="module")
def api(gateway):
    # codegen_stream calls codegen_preprocess (loaded with codegen) and the generator by BLS
    gateway.triton.load("text_embedding", "ner", "food_captioning", "codegen_generator", "codegen", "codegen_stream")
    r = gateway.http.post("/load_clip_model", json={"model_name": CLIP_DEMO})
    assert r.status_code == 200, r.text
    yield gateway
    gateway.http.delete(f"/collections/{COLLECTION}")


@pytest.fixture(scope="module")
def shots(tmp_path_factory) -> Path:
    folder = Path(os.environ.get("UI_SCREENSHOTS_DIR") or tmp_path_factory.mktemp("ui-shots"))
    folder.mkdir(parents=True, exist_ok=True)
    return folder


@pytest.fixture(scope="module")
def images(tmp_path_factory) -> list[Path]:
    folder = tmp_path_factory.mktemp("images")
    paths = []
    for i in range(N_IMAGES):
        path = folder / f"img-{i}.png"
        path.write_bytes(encode(demo_image(i)))
        paths.append(path)
    return paths


@pytest.fixture(scope="module")
def browser():
    with local_browser() as browser:
        yield browser


@pytest.fixture
def page(browser, api):
    context = browser.new_context(viewport={"width": 1280, "height": 900})
    page = context.new_page()
    log = RequestLog()
    log.attach(page)
    page.goto(f"{api.url}/ui")
    page.fill("#collection", COLLECTION)
    yield page
    assert log.left_the_machine() == [], log.left_the_machine()
    context.close()


def drop_files(page, selector: str, paths: list[Path]) -> None:
    """A real drop event on the zone, carrying the files in a DataTransfer (as a desktop drag would)."""
    files = [{"name": p.name, "data": base64.b64encode(p.read_bytes()).decode()} for p in paths]
    page.evaluate("""([selector, files]) => {
        const transfer = new DataTransfer();
        for (const f of files) {
            const bytes = Uint8Array.from(atob(f.data), c => c.charCodeAt(0));
            transfer.items.add(new File([bytes], f.name, {type: "image/png"}));
        }
        document.querySelector(selector).dispatchEvent(new DragEvent("drop", {dataTransfer: transfer, bubbles: true}));
    }""", [selector, files])


def wait_until(page, expression: str, timeout: float = 60_000) -> None:
    """Polls a JavaScript expression from here: Playwright's wait_for_function evaluates strings inside the
    page, which the page's Content-Security-Policy (no 'unsafe-eval') refuses."""
    import time

    deadline = time.monotonic() + timeout / 1000
    while not page.evaluate(f"() => Boolean({expression})"):
        errors = page.eval_on_selector_all(".error", "es => es.map(e => e.textContent).filter(Boolean)")
        assert time.monotonic() < deadline and not errors, f"waiting for {expression}: errors shown {errors}"
        page.wait_for_timeout(200)


def grid(page) -> list[tuple[str, float, str]]:
    return page.eval_on_selector_all("#results li", """items => items.map(li => [
        li.querySelector('.id').textContent, Number(li.querySelector('.score').textContent),
        li.querySelector('img').getAttribute('src') || ''])""")


def test_page_is_served_with_a_same_origin_policy(api):
    r = api.http.get("/ui/")
    assert r.status_code == 200 and "<title>Triton pipelines</title>" in r.text
    assert r.headers["content-security-policy"].startswith("default-src 'self'")
    assert api.http.get("/ui", follow_redirects=False).headers["location"] == "/ui/"


def test_index_by_dropping_then_search_by_text_and_by_image(page, api, images, shots):
    drop_files(page, "#index-drop", images[:20])
    wait_until(page, "document.getElementById('index-status').textContent.startsWith('Indexed 20 of 20')",
                           timeout=120_000)
    folder = images[0].parent / "folder"  # the rest as a folder, through the folder picker
    folder.mkdir(exist_ok=True)
    for p in images[20:]:
        (folder / p.name).write_bytes(p.read_bytes())
    (folder / "notes.txt").write_text("not an image: left out")
    page.set_input_files("#index-folder", str(folder))
    wait_until(page, "document.getElementById('index-status').textContent.startsWith('Indexed 4 of 4')",
                           timeout=120_000)
    assert api.http.get(f"/collections/{COLLECTION}").json()["count"] == N_IMAGES
    assert page.inner_text("#search-error") == ""

    page.fill("#search-text", "a red square")
    page.fill("#search-limit", "8")
    page.click("#search-form button")
    page.wait_for_selector("#results li .score")
    shown = grid(page)
    direct = api.http.post(f"/collections/{COLLECTION}/search", json={"text": "a red square", "limit": 8}).json()
    assert [s[0] for s in shown] == [h["id"] for h in direct["results"]]
    assert [s[1] for s in shown] == [round(h["score"], 3) for h in direct["results"]]
    assert all(src.startswith("data:image/jpeg;base64,") for _, _, src in shown), "a thumbnail per result"
    # the thumbnails are decoded images, not broken ones
    assert page.eval_on_selector_all("#results img", "imgs => imgs.every(i => i.complete && i.naturalWidth > 0)")
    page.screenshot(path=str(shots / "search-text.png"), full_page=False)

    page.set_input_files("#query-file", str(images[7]))
    wait_until(page, "document.querySelector('#results li .id')?.textContent === 'img-7'", timeout=60_000)
    shown = grid(page)
    assert shown[0][0] == "img-7" and shown[0][1] == pytest.approx(1.0, abs=2e-3), "an indexed image finds itself"
    assert [s[1] for s in shown] == sorted((s[1] for s in shown), reverse=True)
    page.locator("#search").screenshot(path=str(shots / "search-image.png"))


def test_ner_panel_highlights_the_apis_entities(page, api, shots):
    text = "George Washington went to Washington. Angela Merkel visited Paris with Siemens."
    page.fill("#ner-text", text)
    page.click("#ner-form button")
    wait_until(page, "document.querySelector('#ner-output').textContent.length > 0", timeout=60_000)
    entities = api.http.post("/v1/ner", json={"text": text}).json()["entities"]
    assert entities, "the demo tagger marks entities in ordinary sentences"
    marks = page.eval_on_selector_all("#ner-output mark", "ms => ms.map(m => [m.textContent, m.dataset.label])")
    assert marks == [[e["text"], e["label"]] for e in entities]
    assert page.eval_on_selector("#ner-output", "o => o.textContent") == text, "the whole text, entities marked in place"
    page.locator("#ner").screenshot(path=str(shots / "ner.png"))


def test_caption_panel_shows_label_score_and_caption(page, api, shots, tmp_path):
    photo = tmp_path / "dish.png"
    photo.write_bytes(png_bytes((160, 120), (180, 120, 40), pattern=3))
    page.set_input_files("#caption-file", str(photo))
    page.wait_for_selector("#caption-figure:not([hidden])", timeout=120_000)
    direct = api.http.post("/v1/caption", json={"image": base64.b64encode(photo.read_bytes()).decode()}).json()
    assert page.inner_text("#caption-label") == direct["label"]
    assert page.inner_text("#caption-text") == direct["caption"]
    assert float(page.inner_text("#caption-score")) == pytest.approx(direct["score"], abs=1e-3)
    page.locator("#caption").screenshot(path=str(shots / "caption.png"))


def test_completion_streams_into_the_page(page, api, shots):
    page.fill("#prompt", "def fibonacci(n):")
    page.fill("#max-tokens", "24")
    # count the changes of the text: a stream is shown piece by piece (one change per event), not as one answer
    page.evaluate("""() => { window.__updates = 0; new MutationObserver(records => window.__updates += records.length)
        .observe(document.getElementById('completion-text'), {childList: true, characterData: true, subtree: true}); }""")
    page.click("#complete-form button")
    wait_until(page, "document.getElementById('complete-status').textContent.startsWith('finished')",
                           timeout=180_000)
    unary = api.http.post("/v1/completions", json={"model": "codegen", "prompt": "def fibonacci(n):",
                                                    "max_tokens": 24, "temperature": 0}).json()
    assert page.eval_on_selector("#completion-text", "e => e.textContent") == unary["choices"][0]["text"]
    assert page.inner_text("#complete-status") == f"finished: {unary['choices'][0]['finish_reason']}"
    # the gateway joins pieces that queued up together (gateway/completions/sequences.py), so how many events
    # come depends on timing; what must hold is that the page shows each one as it arrives
    events = int(page.eval_on_selector("#completion-text", "e => e.dataset.events || 0"))
    assert events >= 1 and page.evaluate("window.__updates") >= events, "the completion was not shown event by event"
    page.locator("#complete").screenshot(path=str(shots / "completion.png"))


def test_compare_panel_gives_the_cosine_of_the_apis_embeddings(page, api, shots):
    import numpy as np

    a, b = "A man is eating food.", "A man is eating a piece of bread."
    page.fill("#sentence-a", a)
    page.fill("#sentence-b", b)
    page.click("#compare-form button")
    page.wait_for_selector("#similarity[data-cosine]", timeout=60_000)
    data = api.http.post("/v1/embeddings", json={"model": "sentence-transformers/all-MiniLM-L6-v2",
                                                  "input": [a, b]}).json()["data"]
    expected = float(np.dot(data[0]["embedding"], data[1]["embedding"]))
    assert float(page.get_attribute("#similarity", "data-cosine")) == pytest.approx(expected, abs=1e-5)
    page.locator("#compare").screenshot(path=str(shots / "compare.png"))


def test_errors_are_the_apis_messages(page, api, tmp_path):
    # an empty text for NER
    page.fill("#ner-text", "   ")
    page.click("#ner-form button")
    page.wait_for_selector("#ner-error:not(:empty)")
    expected = api.http.post("/v1/ner", json={"text": "   "}).json()["error"]["message"]
    assert page.inner_text("#ner-error") == expected
    # a file that is not an image, for the caption
    bogus = tmp_path / "notes.png"
    bogus.write_bytes(b"this is not an image")
    page.set_input_files("#caption-file", str(bogus))
    page.wait_for_selector("#caption-error:not(:empty)")
    expected = api.http.post("/v1/caption", json={"image": base64.b64encode(bogus.read_bytes()).decode()})
    assert expected.status_code == 400 and page.inner_text("#caption-error") == expected.json()["error"]["message"]
    # a collection that does not exist
    page.fill("#collection", "no-such-collection")
    page.fill("#search-text", "anything")
    page.click("#search-form button")
    page.wait_for_selector("#search-error:not(:empty)")
    expected = api.http.post("/collections/no-such-collection/search", json={"text": "anything", "limit": 12})
    assert expected.status_code == 404 and page.inner_text("#search-error") == expected.json()["error"]["message"]
    # a completion the API refuses before streaming (max_tokens over its limit)
    page.fill("#max-tokens", "100000")
    page.click("#complete-form button")
    page.wait_for_selector("#complete-error:not(:empty)")
    expected = api.http.post("/v1/completions", json={"model": "codegen", "prompt": "def fibonacci(n):",
                                                       "max_tokens": 100000, "temperature": 0, "stream": True})
    assert expected.status_code == 400 and page.inner_text("#complete-error") == expected.json()["error"]["message"]


def test_phone_sized_window_and_keyboard(browser, api, shots):
    fresh = launch_local(browser.browser_type)  # a file chooser did not open in a browser the other tests had used
    try:
        phone_and_keyboard(fresh, api, shots)
    finally:
        fresh.close()


def phone_and_keyboard(browser, api, shots):
    context = browser.new_context(viewport={"width": 390, "height": 844}, is_mobile=True, has_touch=True)
    page = context.new_page()
    log = RequestLog()
    log.attach(page)
    page.goto(f"{api.url}/ui/")
    width = page.evaluate("() => [document.documentElement.scrollWidth, window.innerWidth]")
    assert width[0] <= width[1], f"the page scrolls sideways on a phone: {width}"
    page.screenshot(path=str(shots / "phone.png"))
    # keyboard only: Tab starts at the panel links, and Enter on a drop zone opens its file chooser
    page.keyboard.press("Tab")
    focused = page.evaluate("document.activeElement.id || document.activeElement.getAttribute('href')")
    assert focused == "#search"
    zone = page.locator("#caption-drop")
    zone.focus()
    assert page.evaluate("document.activeElement.id") == "caption-drop"
    with page.expect_file_chooser(timeout=60_000) as chooser:
        zone.press("Enter")
    assert not chooser.value.is_multiple()
    # the sentences compare with Enter in a field (a form submit), the result announced in a live region
    page.focus("#sentence-b")
    page.keyboard.press("Enter")
    page.wait_for_selector("#similarity[data-cosine]", timeout=60_000)
    assert page.get_attribute("#similarity", "aria-live") == "polite"
    assert log.left_the_machine() == []
    context.close()
