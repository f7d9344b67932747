"""What both API clients share: timeouts, the errors they raise, and error decoding.

:class:`~scheduler.kube.client.KubeApi` (the ``kubernetes`` client, blocking) and
:class:`~scheduler.kube.aio.AsyncPoster` (the asyncio Binding POST) raise the same
:class:`ApiError` / :class:`ApiUnavailable` and read the same :class:`Timeouts`; they live
here, below both, so neither client imports the other's module for them. ``client`` re-exports
every name.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import orjson

DEFAULT_CONNECT_TIMEOUT = 5.0
DEFAULT_READ_TIMEOUT = 20.0
DEFAULT_WATCH_SECONDS = 300
"""Server-side ``timeoutSeconds`` of one watch request; the watcher then re-watches."""


@dataclass(frozen=True, slots=True)
class Timeouts:
    """Request timeouts in seconds.

    Attributes:
        connect: TCP + TLS connect.
        read: reading a whole non-watch response (list, get, binding).
        watch_seconds: server-side duration of one watch request. The client's read
            timeout on a watch is ``watch_seconds + read`` (the server may stay silent
            until its own timeout; bookmarks are not guaranteed).
    """

    connect: float = DEFAULT_CONNECT_TIMEOUT
    read: float = DEFAULT_READ_TIMEOUT
    watch_seconds: int = DEFAULT_WATCH_SECONDS

    @property
    def request(self) -> tuple[float, float]:
        """``_request_timeout`` of an ordinary request."""
        return (self.connect, self.read)

    def watch(self, server_seconds: int) -> tuple[float, float]:
        """``_request_timeout`` of a watch lasting ``server_seconds`` on the server."""
        return (self.connect, float(server_seconds) + self.read)


class ApiError(Exception):
    """The API server answered with a non-2xx status.

    Attributes:
        status: HTTP status (e.g. 404, 409, 410, 500); 0 when there was no answer.
        reason: the ``Status`` reason (``NotFound``, ``Conflict``, ``Expired`` ...) or the
            HTTP reason phrase.
        message: the ``Status`` message, else the HTTP reason.
        body: the decoded ``Status`` object, or None.
    """

    def __init__(
        self,
        status: int,
        reason: str = "",
        message: str = "",
        body: Mapping[str, Any] | None = None,
    ) -> None:
        self.status = status
        self.reason = reason
        self.message = message or reason or f"HTTP {status}"
        self.body = body
        super().__init__(f"{status} {reason}: {self.message}".strip())

    @classmethod
    def from_status(cls, status_obj: Mapping[str, Any], http_status: int = 0) -> ApiError:
        """Build from a ``Status`` object (an error body or a watch ERROR event)."""
        code = int(status_obj.get("code") or http_status or 0)
        return cls(
            code,
            str(status_obj.get("reason") or ""),
            str(status_obj.get("message") or ""),
            status_obj,
        )

    @property
    def gone(self) -> bool:
        """410: the resourceVersion is too old; relist."""
        return self.status == 410

    @property
    def conflict(self) -> bool:
        """409 Conflict (e.g. a binding of an already bound pod)."""
        return self.status == 409

    @property
    def not_found(self) -> bool:
        """404."""
        return self.status == 404


class ApiUnavailable(ApiError):
    """No usable answer: connection refused or reset, TLS failure, or a timeout."""

    def __init__(self, message: str, timeout: bool = False) -> None:
        super().__init__(0, "Timeout" if timeout else "Unavailable", message)
        self.timeout = timeout


def decode_status(body: bytes | str | None, http_status: int, reason: str = "") -> ApiError:
    """An :class:`ApiError` from a raw error response body (a ``Status`` or anything)."""
    obj: Any = None
    if body:
        try:
            obj = orjson.loads(body)
        except orjson.JSONDecodeError:
            obj = None
    if isinstance(obj, Mapping) and obj.get("kind") == "Status":
        return ApiError.from_status(obj, http_status)
    text = body.decode("utf-8", "replace") if isinstance(body, bytes) else (body or "")
    return ApiError(http_status, reason, text.strip()[:500] or reason)


def json_object(data: bytes) -> dict[str, Any]:
    """An API server's answer as a JSON object.

    Raises:
        ApiUnavailable: it is not JSON, or not an object.
    """
    try:
        out = orjson.loads(data)
    except orjson.JSONDecodeError as exc:
        raise ApiUnavailable(f"response is not JSON: {exc}") from None
    if not isinstance(out, dict):
        raise ApiUnavailable("response is not a JSON object")
    return out
