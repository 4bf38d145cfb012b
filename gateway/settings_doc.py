"""The table of the gateway's environment variables in docs/settings.md, generated from the fields of
gateway.settings.Settings (variable, type, default, description), between two markers.

    python -m gateway.settings_doc           # print the table
    python -m gateway.settings_doc --write   # rewrite it in docs/settings.md

tests/test_settings.py fails when the committed table is not the generated one."""
from __future__ import annotations

import argparse
import types
import typing
from pathlib import Path

import annotated_types
from pydantic import AliasChoices
from pydantic.fields import FieldInfo

from gateway.settings import ROOT, Settings

PAGE = ROOT / "docs" / "settings.md"
BEGIN, END = "<!-- settings:begin (python -m gateway.settings_doc --write) -->", "<!-- settings:end -->"
_KINDS = {bool: "flag", int: "integer", float: "number", str: "text", Path: "path"}


def _parts(annotation, metadata: list) -> tuple[object, list]:
    """The type under Optional[...] and Annotated[...], with every constraint met on the way."""
    metadata = list(metadata)
    while True:
        origin, args = typing.get_origin(annotation), typing.get_args(annotation)
        if origin is typing.Annotated:
            annotation = args[0]
            for extra in args[1:]:
                metadata += extra.metadata if isinstance(extra, FieldInfo) else [extra]
        elif origin in (typing.Union, types.UnionType):
            annotation = next(a for a in args if a is not type(None))
        else:
            return annotation, metadata


def type_of(field: FieldInfo) -> str:
    annotation, metadata = _parts(field.annotation, field.metadata)
    if typing.get_origin(annotation) is tuple:
        item = typing.get_args(annotation)[0]
        return "paths, `:`-separated" if item is Path else "list, comma-separated"
    kind = _KINDS[annotation]
    low = next((f"≥ {m.ge}" for m in metadata if isinstance(m, annotated_types.Ge)), None)
    low = low or next((f"> {m.gt}" for m in metadata if isinstance(m, annotated_types.Gt)), None)
    high = next((m.le for m in metadata if isinstance(m, annotated_types.Le)), None)
    if low and high is not None:
        return f"{kind} {low[2:]}–{high}"
    return f"{kind} {low}" if low else kind


def default_of(field: FieldInfo) -> str:
    shown = (field.json_schema_extra or {}).get("shown_default")
    if shown:
        return shown
    if field.default_factory is not None:  # computed on this machine: the page would differ on the next
        raise ValueError(f"{variables_of(field)}: a default_factory needs json_schema_extra=shown_default(...)")
    value = field.default
    if value is None:
        return "unset"
    if isinstance(value, bool):
        return "`on`" if value else "`off`"
    if isinstance(value, tuple):
        return "empty" if not value else f"`{','.join(map(str, value))}`"
    for unit, size in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if isinstance(value, int) and value >= size and value % size == 0 and variables_of(field)[0].endswith("BYTES"):
            return f"`{value}` ({value // size} {unit})"
    return f"`{value}`"


def variables_of(field: FieldInfo) -> list[str]:
    alias = field.validation_alias
    return [str(c) for c in alias.choices] if isinstance(alias, AliasChoices) else [alias] if alias else []


def _cell(text: str) -> str:
    """A pipe outside code spans escaped (Python-Markdown's tables take one inside a code span as it is, and
    would show the backslash there)."""
    parts = text.split("`")
    return "`".join(p if i % 2 else p.replace("|", "\\|") for i, p in enumerate(parts))


def table() -> str:
    rows = ["| variable | type | default | description |", "|---|---|---|---|"]
    for field in Settings.model_fields.values():
        names = variables_of(field)
        if not names:  # set through another field's variable (hub_allowlist: HUB_DOWNLOADS)
            continue
        variable = " or ".join(f"`{n}`" for n in names)
        cells = (variable, type_of(field), default_of(field), field.description or "")
        rows.append("| " + " | ".join(_cell(c) for c in cells) + " |")
    return "\n".join(rows)


def committed(page: Path = PAGE) -> str:
    text = page.read_text()
    return text[text.index(BEGIN) + len(BEGIN):text.index(END)].strip()


def write(page: Path = PAGE) -> None:
    text = page.read_text()
    head, tail = text[:text.index(BEGIN) + len(BEGIN)], text[text.index(END):]
    page.write_text(f"{head}\n{table()}\n{tail}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--write", action="store_true", help=f"rewrite the table in {PAGE.relative_to(ROOT)}")
    if parser.parse_args().write:
        write()
    else:
        print(table())


if __name__ == "__main__":
    main()
