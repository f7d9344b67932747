"""Raw HTTP/1.1 responses with a JSON body, built as one buffer.

The connection guard (``guard.py``: its own 400 for malformed HTTP) and the verbs' fast lane
(``fastlane.py``: every verb answer) write responses straight to the transport; both build
them here, below both, so neither imports the other for it.
"""

from __future__ import annotations

from http import HTTPStatus

JSON_HEAD = b"content-type: application/json\r\ncontent-length: %d\r\n"
_CLOSE_HEADER = b"connection: close\r\n"


def status_line(status: int) -> bytes:
    """``HTTP/1.1 <status> <phrase>\\r\\n``."""
    try:
        phrase = HTTPStatus(status).phrase
    except ValueError:
        phrase = ""
    return f"HTTP/1.1 {status} {phrase}\r\n".encode()


_STATUS = {s: status_line(s) for s in (200, 400, 405, 413, 500)}


def json_response(status: int, body: bytes, keep_alive: bool) -> bytes:
    """One HTTP/1.1 response with a JSON body, head and body in one buffer."""
    head = _STATUS.get(status) or status_line(status)
    close = b"" if keep_alive else _CLOSE_HEADER
    return b"%s%s%s\r\n%s" % (head, JSON_HEAD % len(body), close, body)
