"""bench/sweep.py's README section: written between its markers from the run's figures, nothing else touched."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT / "bench"), str(ROOT / "client"), str(ROOT / "backends")]

import sweep  # noqa: E402

ROW = {"pipeline": "ner", "concurrency": 32, "shipped_rps": 70.0, "shipped_p50_ms": 400.0, "best": "db-i1-b64",
       "best_rps": 75.0, "peer_rps": 35.0, "peer_p50_ms": 800.0, "limit": 80.0}


def test_the_readme_section_is_rewritten_between_its_markers_only(tmp_path, monkeypatch):
    monkeypatch.setattr(sweep, "ROOT", tmp_path)
    readme = tmp_path / "README.md"
    readme.write_text(f"before\n{sweep.README_BEGIN}\nold table\n{sweep.README_END}\nafter\n")
    report = tmp_path / "bench-results" / "2026-11-23" / "report.md"
    sweep.write_readme(readme, report, [ROW], "header.")
    text = readme.read_text()
    assert text.startswith("before\n") and text.endswith("after\n") and "old table" not in text
    assert "| ner | 32 | 70.0, 400.0 ms | db-i1-b64 (75.0) | 0.93 | 35.0, 800.0 ms | 2.00x | 0.50 | 0.88 |" in text
    assert "bench-results/2026-11-23/report.md" in text
    sweep.write_readme(readme, report, [dict(ROW, shipped_rps=75.0)], "header.")  # a second run replaces the first
    assert readme.read_text().count(sweep.README_BEGIN) == 1 and "| 1.00 |" in readme.read_text()


def test_a_readme_without_the_markers_is_an_error(tmp_path):
    readme = tmp_path / "README.md"
    readme.write_text("no markers\n")
    with pytest.raises(SystemExit, match="sweep:begin"):
        sweep.write_readme(readme, tmp_path / "report.md", [ROW], "header.")


def test_the_shipped_readme_has_the_section():
    text = (ROOT / "README.md").read_text()
    assert text.count(sweep.README_BEGIN) == 1 and text.count(sweep.README_END) == 1
