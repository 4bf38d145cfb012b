class BadInput(ValueError):
    """The client's input is unusable: becomes an INVALID_ARG error for that request alone."""


def decode_utf8(data: bytes, what: str = "text") -> str:
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise BadInput(f"{what} is not valid UTF-8 (byte {e.start}: {data[e.start:e.start + 1]!r})") from None
