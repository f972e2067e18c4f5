"""CORS, off unless CORS_ORIGINS lists the origins a browser may call the API from (or `*`).

Off, a browser gets no CORS header and its preflights get 405: no web page can read an answer,
and (with POST bodies required to be JSON) none can send a generation request either.
"""

from __future__ import annotations

from starlette.datastructures import Headers
from starlette.middleware import Middleware
from starlette.middleware.cors import CORSMiddleware
from starlette.responses import Response

from api.errors import InvalidRequest
from api.bodies import encode
from config import Settings


class OpenAICORSMiddleware(CORSMiddleware):
    """Starlette's CORSMiddleware whose refused preflights are OpenAI error objects."""

    def preflight_response(self, request_headers: Headers) -> Response:
        response = super().preflight_response(request_headers)
        if response.status_code < 400:
            return response
        error = InvalidRequest(f"{bytes(response.body).decode()}: this server does not allow the origin "
                               f"{request_headers['origin']!r} (CORS_ORIGINS) or the method or headers asked for.")
        headers = {k: v for k, v in response.headers.items() if k.lower() not in ("content-length", "content-type")}
        return Response(encode(error.body()), error.status, headers=headers, media_type="application/json")


def cors_middleware(settings: Settings) -> list[Middleware]:
    """The CORS middleware for settings: none when CORS_ORIGINS is empty."""
    origins = settings.cors_origins
    if not origins:
        return []
    return [Middleware(
        OpenAICORSMiddleware,
        allow_origins=["*"] if "*" in origins else origins,
        allow_methods=["GET", "POST"],
        # SDKs add headers of their own (the openai SDK's x-stainless-*): mirror whatever is asked
        allow_headers=["*"],
        # a listed origin is trusted to reach a server on this machine or network (Chrome's Private Network Access)
        allow_private_network=True,
        expose_headers=["x-request-id", "retry-after"],
    )]
