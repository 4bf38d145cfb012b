"""How the text of one environment variable becomes a typed setting (gateway/settings.py): on/off flags,
comma-separated lists, search paths, resolved paths and bounded numbers. A value these refuse stops the
gateway at start with pydantic's error, which names the variable."""
from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated

from pydantic import AfterValidator, BeforeValidator, Field
from pydantic_settings import NoDecode

_FLAGS = {"1": True, "true": True, "yes": True, "on": True, "0": False, "false": False, "no": False, "off": False}


def _flag(value):
    """The words the gateway has always taken (pydantic's own bool also takes t/f/y/n: not ours)."""
    if isinstance(value, bool):
        return value
    try:
        return _FLAGS[str(value).strip().lower()]
    except KeyError:
        raise ValueError(f"must be one of {', '.join(_FLAGS)}, not {value!r}") from None


def _items(value, separator: str) -> list[str]:
    """The non-empty entries of a separated list (the environment's text) or of a sequence (code, tests)."""
    entries = value.split(separator) if isinstance(value, str) else value
    return [str(e).strip() for e in entries if str(e).strip()]


def _resolve(path: Path) -> Path:
    return path.expanduser().resolve()


Flag = Annotated[bool, BeforeValidator(_flag)]
# NoDecode: a list is written `a,b`, not as the JSON pydantic-settings expects of a list by default
Words = Annotated[tuple[str, ...], NoDecode, BeforeValidator(lambda v: tuple(e.lower() for e in _items(v, ",")))]
Names = Annotated[tuple[str, ...], NoDecode, BeforeValidator(lambda v: tuple(_items(v, ",")))]
ResolvedPath = Annotated[Path, AfterValidator(_resolve)]
# os.pathsep-separated (`:` on Linux), like PATH
SearchPath = Annotated[tuple[Path, ...], NoDecode,
                       BeforeValidator(lambda v: tuple(_resolve(Path(e)) for e in _items(v, os.pathsep)))]
Count = Annotated[int, Field(ge=0)]
Seconds = Annotated[float, Field(ge=0)]
Port = Annotated[int, Field(ge=1, le=65535)]
