"""The layers of the house hold: `lint-imports` checks pyproject.toml's [tool.importlinter] contracts (the rooms'
floors, the stages apart from the rooms and from each other, bench and tools outside the product) against the
code's imports. docs/architecture.md states the same contracts by name."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
LINT_IMPORTS = Path(sys.executable).parent / "lint-imports"  # installed beside this interpreter (requirements.txt)


def test_every_import_contract_is_kept():
    # --no-cache: the graph of the tree as it is now, and no cache folder left in the checkout
    run = subprocess.run([str(LINT_IMPORTS), "--no-cache"], cwd=ROOT, capture_output=True, text=True, timeout=120)
    report = run.stdout + run.stderr
    assert run.returncode == 0, f"an import breaks a contract of pyproject.toml's [tool.importlinter]:\n{report}"
    assert "0 broken" in report and " kept" in report, report  # the contracts were read and checked


def test_the_contracts_cover_every_package_of_the_install():
    """A stage or room added to pyproject.toml's packages is in the graph and in every contract about its kind."""
    import tomllib

    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    packages = set(pyproject["tool"]["setuptools"]["packages"])
    stages = {name for name, folder in pyproject["tool"]["setuptools"]["package-dir"].items()
              if folder.startswith("backends/")}
    rooms, shared = packages - stages, {"stage_common", "codegen_common"}
    linter = pyproject["tool"]["importlinter"]
    contract = {c["name"]: c for c in linter["contracts"]}
    assert set(linter["root_packages"]) == packages and {"gateway", "text_tokenizer"} <= packages
    assert set(contract["The stages are independent of each other"]["modules"]) == stages - shared
    assert set(contract["The stages import no room"]["source_modules"]) == stages
    assert set(contract["The stages import no room"]["forbidden_modules"]) == rooms
    assert set(contract["The product imports no bench or tools"]["source_modules"]) == packages - {"bench", "tools"}
    assert set(contract["The product rooms import no stage, but codegen_common.limits"]["forbidden_modules"]) == stages
    assert set(contract["stage_common imports no other stage"]["forbidden_modules"]) == stages - {"stage_common"}
    assert set(contract["codegen_common imports no stage but stage_common"]["forbidden_modules"]) == stages - shared
    assert set(contract["codegen_common.limits imports no stage code"]["forbidden_modules"]) == stages
