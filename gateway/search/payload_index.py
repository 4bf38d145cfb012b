"""The Faiss store's payload index: for each (key, type, value) of the points' payloads, the rows that
hold it, so that an exact-match filter finds its points without reading every payload (issue 43 item 12:
a Python scan of every point, 267 ms at 200k points, under the store's read lock). Only scalar values a
filter can name are indexed (stores.FILTER_TYPES, by exact type: True and 1 are different values), which
keeps the meaning of stores.matches: a point matches when every key of the filter holds that value."""
from __future__ import annotations

from typing import Iterable

from gateway.search.stores import FILTER_TYPES

Term = tuple[str, type, object]


def _terms(payload: dict) -> Iterable[Term]:
    return ((key, type(value), value) for key, value in payload.items() if type(value) in FILTER_TYPES)


class PayloadIndex:
    def __init__(self):
        self._rows: dict[Term, set[int]] = {}

    def add(self, row: int, payload: dict) -> None:
        for term in _terms(payload):
            self._rows.setdefault(term, set()).add(row)

    def remove(self, row: int, payload: dict) -> None:
        for term in _terms(payload):
            rows = self._rows.get(term)
            if rows is not None:
                rows.discard(row)
                if not rows:
                    del self._rows[term]

    def rebuild(self, rows_and_payloads: Iterable[tuple[int, dict]]) -> None:
        self._rows = {}
        for row, payload in rows_and_payloads:
            self.add(row, payload)

    def postings(self, filter: dict) -> list[set[int]]:
        """The row sets of the filter's terms, smallest first (an empty set when a term is held by no row).
        The sets are the index's own: read them under the store's read lock, never change them."""
        found = []
        for key, value in filter.items():
            if type(value) not in FILTER_TYPES:
                raise ValueError(f"filter value for {key!r} must be a string, integer or boolean, "
                                 f"not {type(value).__name__}")
            found.append(self._rows.get((key, type(value), value), set()))
        return sorted(found, key=len)
