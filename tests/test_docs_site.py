"""Issue 30: the docs site builds with `mkdocs build --strict` (a broken link, a page outside the nav or a
missing page fails), loads nothing from another host, renders the gateway's OpenAPI document; the README
stays short and its pipeline table never drifts from docs/pipelines.md or from the models' configs."""
from __future__ import annotations

import functools
import http.server
import os
import re
import subprocess
import sys
import threading

import pytest

from bench.model_repo import ROOT, parse_config

DOCS = ROOT / "docs"
METHODS = ("get", "post", "put", "patch", "delete")


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    out = tmp_path_factory.mktemp("site")
    build = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "-d", str(out)], cwd=ROOT,
                           capture_output=True, text=True, timeout=600,
                           env=dict(os.environ, NO_MKDOCS_2_WARNING="1", HF_HUB_OFFLINE="1"))
    assert build.returncode == 0, build.stdout[-3000:] + build.stderr[-3000:]
    return out


def test_strict_build_has_every_page(site):
    for page in ("quickstart", "pipelines", "gateway-api", "model-profiles", "operations", "deployment",
                 "performance", "architecture", "development", "ui"):
        assert (site / page / "index.html").is_file(), page


def test_site_loads_nothing_from_another_host(site):
    for html in site.rglob("*.html"):
        text = html.read_text()
        external = re.findall(r'<(?:script|link|img|iframe)\b[^>]*\b(?:src|href)="(?:https?:)?//[^"]*"', text)
        assert not external, f"{html.relative_to(site)} loads {external}"
        assert "fonts.googleapis.com" not in text, html


def test_api_page_lists_every_operation_of_the_app(site):
    import json

    from gateway.app import create_app

    document = create_app().openapi()
    assert json.loads((site / "openapi.json").read_text()) == document  # generated at build time, not stale
    page = (site / "gateway-api" / "index.html").read_text()
    assert "<!-- openapi:operations -->" not in page
    for path, item in document["paths"].items():
        for method in item:
            if method in METHODS:
                assert re.search(rf"<code>{method.upper()}</code>\s*</td>\s*<td><code>{re.escape(path)}</code>", page), \
                    (method, path)


def table(text: str, first_header: str) -> list[list[str]]:
    """The rows (cells stripped) of the first Markdown table whose header starts with `first_header`."""
    lines = text.split("\n")
    start = next(i for i, line in enumerate(lines) if line.startswith(f"| {first_header} |"))
    rows = []
    for line in lines[start + 2:]:
        if not line.startswith("|"):
            break
        rows.append([cell.strip() for cell in line.strip().strip("|").split("|")])
    return rows


def test_readme_is_short_and_links_into_the_docs():
    readme = (ROOT / "README.md").read_text()
    assert len(readme.splitlines()) <= 150
    assert "make triton" in readme and "make test" in readme
    links = re.findall(r"\]\((docs/[^)#]+)(?:#[^)]*)?\)", readme)
    assert len(set(links)) >= 9
    for link in links:
        assert (ROOT / link).is_file(), link


def test_readme_pipeline_table_is_the_docs_table():
    readme = table((ROOT / "README.md").read_text(), "ensemble")
    docs = table((DOCS / "pipelines.md").read_text(), "ensemble")
    assert readme == [row[:3] for row in docs]


def test_pipeline_table_matches_the_ensembles_configs():
    rows = table((DOCS / "pipelines.md").read_text(), "ensemble")
    named = [re.match(r"`(\w+)`", row[0]).group(1) for row in rows]
    assert named == ["text_embedding", "ner", "food_captioning", "codegen", "codegen_stream"]
    for row, model in zip(rows, named):
        config = parse_config(model)
        inputs_cell = (dict(zip(named, rows))["codegen"] if row[1] == "as `codegen`" else row)[1]
        documented_in = set(re.findall(r"`(\w+)`", inputs_cell))
        documented_out = set(re.findall(r"`(\w+)`", row[2]))
        assert {i.name for i in config.input} <= documented_in, model
        assert {o.name for o in config.output} <= documented_out, model
        # and every tensor given with a type and shape has the config's type and dims
        from tritonclient.grpc import model_config_pb2

        declared = {t.name: t for t in [*config.input, *config.output]}
        typed = re.findall(r"`(\w+)` (?:TYPE_)?(STRING|FP32|INT32|UINT64|BOOL) \[([-\d, ]+)\]", inputs_cell + " " + row[2])
        assert typed, model
        for name, dtype, dims in typed:
            tensor = declared[name]
            assert model_config_pb2.DataType.Name(tensor.data_type) == f"TYPE_{dtype}", (model, name)
            assert list(tensor.dims) == [int(d) for d in dims.split(",")], (model, name)


def test_operations_page_names_the_launchers_line():
    page = (DOCS / "operations.md").read_text()
    assert "triton: no usable GPU" in page


@pytest.mark.integration
def test_api_page_renders_the_openapi_document_offline(site):
    """The swagger-ui tag of the API page, in headless chromium with the network limited to 127.0.0.1."""
    from browser import RequestLog, local_browser

    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(site))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        with local_browser() as browser:
            page = browser.new_page()
            log = RequestLog()
            log.attach(page)
            page.goto(f"http://127.0.0.1:{server.server_port}/gateway-api/")
            frame = page.frame_locator("iframe.swagger-ui-iframe")
            frame.locator(".opblock").first.wait_for(timeout=60_000)
            paths = set(frame.locator(".opblock-summary-path").evaluate_all(
                "nodes => nodes.map(n => n.getAttribute('data-path'))"))
            assert "/v1/embeddings" in paths and "/v1/completions" in paths
            assert log.left_the_machine() == [] and log.local_failures() == []
    finally:
        server.shutdown()
        server.server_close()
