"""bench/sweep.py's docs/performance.md section: written between its markers from the run's figures, nothing else touched."""
from __future__ import annotations

import json

import pytest

from bench import sweep

ROW = {"pipeline": "ner", "concurrency": 32, "shipped_rps": 70.0, "shipped_p50_ms": 400.0, "best": "db-i1-b64",
       "best_rps": 75.0, "peer_rps": 35.0, "peer_p50_ms": 800.0, "limit": 80.0, "limit_end": 70.0,
       "h2h_shipped_rps": 72.0, "h2h_best_rps": 73.0}


def test_the_readme_section_is_rewritten_between_its_markers_only(tmp_path, monkeypatch):
    monkeypatch.setattr(sweep, "ROOT", tmp_path)
    readme = tmp_path / "README.md"
    readme.write_text(f"before\n{sweep.README_BEGIN}\nold table\n{sweep.README_END}\nafter\n")
    report = tmp_path / "bench-results" / "2026-11-23" / "report.md"
    sweep.write_readme(readme, report, [ROW], "header.")
    text = readme.read_text()
    assert text.startswith("before\n") and text.endswith("after\n") and "old table" not in text
    assert ("| ner | 32 | 70.0, 400.0 ms | db-i1-b64 (75.0) | 0.93 | 72.0 / 73.0 = 0.99 | 35.0, 800.0 ms | 2.00x | 0.50 | "
            "0.88 / 1.00 |") in text
    assert "- `ner`: header. Report: `bench-results/2026-11-23/report.md`." in text
    # a second run replaces the first; shipped as the matrix's best has no head-to-head ratio
    sweep.write_readme(readme, report, [dict(ROW, best=sweep.SHIPPED, best_rps=70.0)], "header.")
    text = readme.read_text()
    assert text.count(sweep.README_BEGIN) == 1 and "| shipped (70.0) | 1.00 | - |" in text
    assert text.count("| ner | 32 |") == 1 and text.count("- `ner`:") == 1


def test_a_run_of_some_pipelines_keeps_the_other_pipelines_rows_and_run_notes(tmp_path, monkeypatch):
    monkeypatch.setattr(sweep, "ROOT", tmp_path)
    readme = tmp_path / "README.md"
    readme.write_text(f"{sweep.README_BEGIN}\n{sweep.README_END}\n")
    first = tmp_path / "bench-results" / "2026-11-23" / "report.md"
    sweep.write_readme(readme, first, [dict(ROW, pipeline=p, concurrency=c) for p in sweep.PIPELINES for c in (1, 32)],
                       "full run.")
    assert "- `text_embedding`, `ner`, `food_captioning`: full run." in readme.read_text()
    later = tmp_path / "bench-results" / "2026-11-24" / "report-ner.md"
    sweep.write_readme(readme, later, [dict(ROW, pipeline="ner", concurrency=c, shipped_rps=99.0) for c in (1, 32)],
                       "ner again.")
    text = readme.read_text()
    assert "- `text_embedding`, `food_captioning`: full run. Report: `bench-results/2026-11-23/report.md`." in text
    assert "- `ner`: ner again. Report: `bench-results/2026-11-24/report-ner.md`." in text
    rows = [line.split("|")[1:4] for line in text.splitlines() if line.startswith("| ") and "pipeline" not in line]
    # the pipelines in their usual order, each row once, ner's from the later run
    assert [(p.strip(), c.strip()) for p, c, _ in rows] == [(p, c) for p in sweep.PIPELINES for c in ("1", "32")]
    assert all(shipped.startswith(" 99.0") == (p.strip() == "ner") for p, _, shipped in rows)


def test_a_readme_without_the_markers_is_an_error(tmp_path):
    readme = tmp_path / "README.md"
    readme.write_text("no markers\n")
    with pytest.raises(SystemExit, match="sweep:begin"):
        sweep.write_readme(readme, tmp_path / "report.md", [ROW], "header.")


def test_the_performance_page_has_the_section():
    text = sweep.PERFORMANCE_PAGE.read_text()
    assert text.count(sweep.README_BEGIN) == 1 and text.count(sweep.README_END) == 1


def _row(variant, c, rps):
    return {"variant": variant, "concurrency": c, "rps": rps}


def test_the_contenders_are_the_two_best_that_beat_shipped_at_each_concurrency():
    rows = [_row(sweep.SHIPPED, 1, 50.0), _row("a", 1, 60.0), _row("b", 1, 55.0), _row("c", 1, 52.0), _row("d", 1, 40.0),
            _row(sweep.SHIPPED, 32, 100.0), _row("a", 32, 90.0), _row("c", 32, 101.0), _row("d", 32, 99.0)]
    assert sweep.contenders(rows) == {"a": [1], "b": [1], "c": [32]}
    assert sweep.contenders(rows, top=3) == {"a": [1], "b": [1], "c": [1, 32]}
    assert sweep.contenders([_row(sweep.SHIPPED, 1, 50.0), _row("a", 1, 50.0)]) == {}  # a tie does not contend


def test_the_head_to_head_runs_shipped_at_every_contested_level_in_abba_order():
    plan = sweep.head_to_head_plan({"b": [32], "a": [1, 32]}, rounds=3)
    first = [(sweep.SHIPPED, [1, 32]), ("a", [1, 32]), ("b", [32])]
    assert plan == first + first[::-1] + first
    assert sweep.head_to_head_plan({}, rounds=2) == []


def test_the_head_to_head_mean_is_per_configuration_and_level():
    runs = [_row(sweep.SHIPPED, 32, 100.0), _row("a", 32, 120.0), _row("a", 32, 110.0), _row(sweep.SHIPPED, 32, 90.0),
            _row(sweep.SHIPPED, 1, 10.0)]
    means = sweep.head_to_head_means(runs)
    assert means == {(sweep.SHIPPED, 32): 95.0, ("a", 32): 115.0, (sweep.SHIPPED, 1): 10.0}
    lines = sweep.head_to_head_lines(runs, means, 2)
    assert "| shipped | 32 | 100.0 / 90.0 | 95.0 |" in lines and "| a | 32 | 120.0 / 110.0 | 115.0 |" in lines
    assert lines.index("| shipped | 1 | 10.0 | 10.0 |") < lines.index("| shipped | 32 | 100.0 / 90.0 | 95.0 |")
    assert "no configuration beat" in sweep.head_to_head_lines([], {}, 2)[0]


def test_a_variant_sets_the_runtime_of_every_network_and_the_instances_of_the_main_stage_only():
    variant = sweep.Variant(dynamic_batching=False, instances=2, max_batch=8, runtime="torch")
    classifier = json.loads(sweep.config_json("food_captioning_classifier", variant, vary_instances=False))
    assert classifier["parameters"]["runtime"] == {"string_value": "torch"}
    assert classifier["instance_group"][0]["count"] == 1 and "dynamic_batching" not in classifier
    assert classifier["max_batch_size"] == 8
    preprocess = json.loads(sweep.config_json("food_captioning_preprocess", variant, vary_instances=True))
    assert preprocess["instance_group"][0]["count"] == 2 and "runtime" not in preprocess["parameters"]
    assert sweep.PIPELINES["food_captioning"]().stage == "food_captioning_preprocess"
