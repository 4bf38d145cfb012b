"""Errors every stage reports the same way: the client's fault (INVALID_ARG, its own request only),
an overload (UNAVAILABLE: retry later) and internal faults (a short message with an id; the details
go to the server log, never to the client)."""
from __future__ import annotations

import logging
import sys
import traceback
import uuid

_log = logging.getLogger("stage")
if not _log.handlers:  # the stub's stderr lands in the server log
    _handler = logging.StreamHandler(sys.stderr)
    _handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    _log.addHandler(_handler)
    _log.setLevel(logging.INFO)


class BadInput(ValueError):
    """The client's input is unusable: becomes an INVALID_ARG error for that request alone."""


class Overloaded(RuntimeError):
    """Over capacity: becomes an UNAVAILABLE error, refused at once (the client may retry)."""


class StageError(Exception):
    """Another stage answered a BLS call with an error: passed on to the client as it is (its message
    and its code), not turned into an internal error."""

    def __init__(self, error):
        super().__init__(error.message())
        self.error = error


def decode_utf8(data: bytes, what: str = "text") -> str:
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise BadInput(f"{what} is not valid UTF-8 (byte {e.start}: {data[e.start:e.start + 1]!r})") from None


def check_limit(value: int, limit: int, what: str, setting: str) -> None:
    """Refuse a request whose `what` exceeds `limit`, naming the setting that holds the limit."""
    if value > limit:
        raise BadInput(f"{what} is {value}, over the limit of {limit} ({setting})")


FINISH_REASONS = ("stop", "length")  # what a client may see as finish_reason (README, OpenAI's completions)


def check_finish_reason(reason: str) -> None:
    """A generation front passes on only documented finish reasons: any other end (e.g. the generator's
    "cancelled" for a row it dropped) fails the request as an overload, which the client may retry."""
    if reason not in FINISH_REASONS:
        raise Overloaded(f"the generator ended the request early ({reason or 'no finish_reason'}): retry")


def internal_error_message(exc: BaseException, where: str = "") -> str:
    """Log the full error with a fresh id and return what the client may see: the id, no internals."""
    error_id = uuid.uuid4().hex[:12]
    _log.error("internal error %s%s: %s", error_id, f" in {where}" if where else "",
               "".join(traceback.format_exception(type(exc), exc, exc.__traceback__)).rstrip())
    return f"internal error (id {error_id}, see the server log)"


def check_token_rows(ids: np.ndarray, mask: np.ndarray, vocab_size: int | None, max_positions: int | None) -> None:
    """A direct caller's input_ids + attention_mask [rows, length]: same shape, a token in every row, ids
    inside the vocabulary and rows no longer than the position embeddings. Either of the last two would
    make the whole shared forward raise (an index out of range), so they are refused per request first."""
    if ids.shape != mask.shape:
        raise BadInput(f"input_ids {ids.shape} and attention_mask {mask.shape} differ in shape")
    if ids.ndim != 2:
        raise BadInput(f"input_ids must be [rows, tokens], not {list(ids.shape)}")
    if ids.size and (mask.sum(axis=1) == 0).any():
        raise BadInput("every row needs at least one token (attention_mask all zero)")
    if vocab_size is not None and ids.size and (ids.min() < 0 or ids.max() >= vocab_size):
        raise BadInput(f"input_ids must lie in [0, {vocab_size}) (the model's vocabulary); got "
                       f"{int(ids.min())}..{int(ids.max())}")
    if max_positions is not None:
        check_limit(ids.shape[1], max_positions, "the token count of a row", "the model's max_position_embeddings")
