"""Request fields made safe to log (issue 43, item 10). A path is percent-decoded before the app sees it, so
`GET /nope%0a2026-11-27 13:00:00,000 WARNING gateway.audit: ...` would write a well-formed fake log line;
terminal escapes (`\\x1b[...`) would repaint a reader's screen. Every field a client chose (path, query,
header values, names from a body) goes through `printable` before it reaches a log line."""
from __future__ import annotations

MAX_CHARS = 1024  # a field longer than this is cut (a 16 KiB header would flood the log otherwise)


def _escape(char: str) -> str:
    code = ord(char)
    if char in "\n\r\t":
        return {"\n": "\\n", "\r": "\\r", "\t": "\\t"}[char]
    return f"\\x{code:02x}" if code <= 0xFF else f"\\u{code:04x}" if code <= 0xFFFF else f"\\U{code:08x}"


def printable(text: str, limit: int = MAX_CHARS) -> str:
    """`text` with every character that is not printable (C0 and C1 controls, DEL, line and paragraph
    separators, other Unicode format characters) written as a Python-style escape, cut at `limit`.
    A backslash is left as is: what matters is that no escape can start a new line or move the cursor."""
    if len(text) > limit:
        text = text[:limit] + "..."
    if text.isprintable():  # the common case: one C-level scan, no copy
        return text
    return "".join(c if c.isprintable() else _escape(c) for c in text)
