"""Reading one gauge out of Prometheus text (Triton's /metrics), by one of its labels."""
from __future__ import annotations

import re

_LINE = re.compile(r'^(?P<name>[a-zA-Z_:][a-zA-Z0-9_:]*)\{(?P<labels>[^}]*)\}\s+(?P<value>\S+)')
_LABEL = re.compile(r'(?P<key>[a-zA-Z_][a-zA-Z0-9_]*)="(?P<value>(?:[^"\\]|\\.)*)"')


def gauge_by_label(text: str, family: str, label: str) -> dict[str, float]:
    """{value of `label`: sample value} for the samples of `family`."""
    values: dict[str, float] = {}
    for line in text.splitlines():
        match = _LINE.match(line)
        if not match or match.group("name") != family:
            continue
        labels = {m.group("key"): m.group("value") for m in _LABEL.finditer(match.group("labels"))}
        if label in labels:
            try:
                values[labels[label]] = float(match.group("value"))
            except ValueError:
                continue
    return values
