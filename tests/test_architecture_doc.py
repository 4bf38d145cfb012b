"""docs/architecture.md describes the house: every top-level folder that holds Python code has its own
paragraph there (a `**`folder/`**` heading), so a new room cannot appear without its map entry."""
from __future__ import annotations

import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DOC = ROOT / "docs" / "architecture.md"


def python_folders() -> set[str]:
    """Top-level folders with a tracked or new (not ignored) .py file, as git sees the tree."""
    listed = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard", "*.py"],
                            cwd=ROOT, capture_output=True, text=True, check=True).stdout.split()
    return {path.split("/")[0] for path in listed if "/" in path and not path.startswith(".")}  # no venvs


def test_every_python_folder_has_a_paragraph():
    folders = python_folders()
    assert {"gateway", "launcher", "backends", "supervisor"} <= folders  # the listing itself works
    text = DOC.read_text()
    missing = sorted(name for name in folders if f"**`{name}/`**" not in text)
    assert not missing, f"docs/architecture.md has no paragraph for {missing}"


def test_the_picture_names_every_python_folder():
    picture = DOC.read_text().split("## The house", 1)[1].split("## Rooms", 1)[0]
    missing = sorted(name for name in python_folders() if f"{name}/" not in picture)
    assert not missing, f"the picture in docs/architecture.md misses {missing}"
