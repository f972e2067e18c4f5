"""Every error frame the engine sends a client, built in one place.

The API turns each frame back into its own error class field by field (status, type, code,
param), so what a client can receive from the engine reads here, one constructor per kind.
"""

from __future__ import annotations

import msgspec

from ipc import Error


def invalid_request(message: str, param: str | None = None, code: str | None = None,
                    request_id: str = "") -> Error:
    """400: the request, as sent, is one the engine cannot run; message says what to change."""
    return Error(status=400, message=message, param=param, code=code,
                 request_id=request_id)


class Refused(Exception):
    """Raised where a request is checked; error is the 400 its client gets."""

    def __init__(self, message: str, param: str | None = None, code: str | None = None):
        super().__init__(message)
        self.error = invalid_request(message, param, code)

    def to(self, request_id: str) -> Error:
        """The error frame for the request with this id."""
        return msgspec.structs.replace(self.error, request_id=request_id)


def shutting_down(request_id: str, message: str) -> Error:
    """503: the engine is stopping; the client may retry once it is back."""
    return Error(status=503, code="shutting_down", request_id=request_id,
                 message=message)


def timed_out(request_id: str) -> Error:
    """504: the request outlived REQUEST_TIMEOUT."""
    return Error(status=504, code="request_timeout", request_id=request_id,
                 message="the request exceeded REQUEST_TIMEOUT before it finished; raise REQUEST_TIMEOUT "
                         "or ask for fewer tokens")


def generation_failed(request_id: str, message: str) -> Error:
    """500: the engine's own failure with this request; other requests go on."""
    return Error(status=500, code="generation_failed", request_id=request_id,
                 message=message)


def queue_full(request_id: str, max_batch: int, max_queue: int) -> Error:
    """429: no room for the request's choices right now."""
    return Error(status=429, code="queue_full", request_id=request_id,
                 message=f"the engine is full ({max_batch} running and {max_queue} waiting sequences at most); "
                         "retry after a moment")


def client_not_reading(request_id: str, events: int) -> Error:
    """408: the client let its output pile up, so the request was cancelled."""
    return Error(status=408, code="client_not_reading", request_id=request_id,
                 message=f"the client stopped reading its output ({events} events waited, OUTPUT_BUFFER_EVENTS); "
                         "the request was cancelled")
