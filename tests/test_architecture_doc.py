"""docs/architecture.md describes the house: every top-level folder that holds Python code has its own
paragraph there (a `**`folder/`**` heading), so a new room cannot appear without its map entry; its picture draws
exactly the code's imports between rooms, on the floors of pyproject.toml's layers contract, and it names every
import contract, so that neither the drawing nor the stated rules can drift from the code."""
from __future__ import annotations

import re
import subprocess
import tomllib
from pathlib import Path

import grimp

ROOT = Path(__file__).resolve().parent.parent
DOC = ROOT / "docs" / "architecture.md"
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
CONTRACTS = PYPROJECT["tool"]["importlinter"]["contracts"]
BACKENDS = "backends"


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


def picture() -> str:
    """The drawing: the first text block of "## The house"."""
    house = DOC.read_text().split("## The house", 1)[1].split("## Rooms", 1)[0]
    return house.split("```text\n", 1)[1].split("```", 1)[0]


# a room's line: "[floor N | apart]  room/  (what it is)  [-> room/ room/ ...]"
ROOM_LINE = re.compile(r"^\s*(?:(floor \d+|apart)\s+)?(\w+)/\s+\([^)]*\)\s*(?:->(.*))?$")


def drawn() -> tuple[dict[str, list[str]], set[tuple[str, str]]]:
    """The picture's floors (label -> its rooms, top first) and its arrows (room, imported room)."""
    floors: dict[str, list[str]] = {}
    arrows, floor = set(), None
    for line in picture().splitlines():
        if line.strip().startswith("beside"):  # the folders without imports of their own
            break
        match = ROOM_LINE.match(line)
        if match is None:
            continue
        floor = match.group(1) or floor
        floors.setdefault(floor, []).append(match.group(2))
        arrows |= {(match.group(2), target) for target in re.findall(r"(\w+)/", match.group(3) or "")}
    return floors, arrows


def room_of_package() -> dict[str, str]:
    """Each top-level package of the editable install -> its room: a stage's is backends/."""
    package_dirs = PYPROJECT["tool"]["setuptools"].get("package-dir", {})
    return {package: package_dirs.get(package, package).split("/")[0]
            for package in PYPROJECT["tool"]["importlinter"]["root_packages"]}


def code_arrows() -> set[tuple[str, str]]:
    """Every (room, room it imports) of the code, as import-linter's graph (grimp) sees the imports."""
    rooms = room_of_package()
    graph = grimp.build_graph(*rooms, cache_dir=None)
    arrows = set()
    for module in graph.modules:
        importer = rooms[module.split(".")[0]]
        for imported in graph.find_modules_directly_imported_by(module):
            if rooms[imported.split(".")[0]] != importer:
                arrows.add((importer, rooms[imported.split(".")[0]]))
    return arrows


def test_the_picture_draws_exactly_the_codes_arrows_between_rooms():
    floors, arrows = drawn()
    assert BACKENDS in floors["apart"] and ("bench", "launcher") in arrows  # the picture parses
    found = code_arrows()
    assert ("launcher", "gateway") in found  # the graph holds the rooms' imports
    assert not found - arrows, f"imports the picture of docs/architecture.md does not draw: {sorted(found - arrows)}"
    assert not arrows - found, f"arrows drawn in docs/architecture.md that the code lacks: {sorted(arrows - found)}"


def test_the_pictures_floors_are_the_layers_contract():
    layers, = [contract["layers"] for contract in CONTRACTS if contract["type"] == "layers"]
    floors, _ = drawn()
    numbered = sorted((label for label in floors if label.startswith("floor")), key=lambda f: -int(f.split()[1]))
    assert [sorted(floors[label]) for label in numbered] == [sorted(r.strip() for r in layer.split("|"))
                                                             for layer in layers]
    assert floors["apart"] == [BACKENDS]


def test_the_doc_states_every_import_contract_by_name():
    text = DOC.read_text()
    missing = [contract["name"] for contract in CONTRACTS if f'**"{contract["name"]}"**' not in text]
    assert len(CONTRACTS) >= 5 and not missing, f"docs/architecture.md does not state {missing}"
