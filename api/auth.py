"""Bearer API keys: API_KEY and API_KEYS_FILE guard every /v1 route; the ops routes need an operator's key.

`api_key_guard(settings)` and `ops_guard(settings)` return the middleware list for a Mount or a
Route (`Route("/metrics", endpoint, middleware=ops_guard(settings))`): empty when no key is set.
A tenant's key on an ops route gets 403: the dashboard shows every tenant's requests. /health stays open.
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Iterable

from starlette.middleware import Middleware
from starlette.types import ASGIApp, Receive, Scope, Send

from api.errors import Forbidden, Unauthorized
from api.tenancy import salt_for, set_salt
from config import Settings
from config.keys import api_keys, operator_keys

NO_OPERATOR = ("Several API keys share this gateway and none is an operator's: set ADMIN_API_KEYS_FILE to a file "
               "of operator keys to read the dashboard, /metrics and /health/detail.")
NOT_OPERATOR = "This route needs an operator's key (one of ADMIN_API_KEYS_FILE); this key is a tenant's."


def _digest(token: bytes) -> bytes:
    # Comparing fixed-length digests keeps the time independent of the keys' lengths too.
    return hashlib.sha256(token).digest()


def _among(presented: bytes, digests: list[bytes]) -> bool:
    ok = False
    for digest in digests:  # no early exit: every key costs the same
        ok |= hmac.compare_digest(presented, digest)
    return ok


class RequireAPIKey:
    """Pure ASGI: 401 unless `Authorization: Bearer <key>` matches one of the keys (constant time).

    With x_api_key, Anthropic's `x-api-key: <key>` is accepted as well (its SDK's and Claude Code's way).
    With operators (a list, maybe empty), an accepted key that is not one of them gets 403.
    """

    def __init__(self, app: ASGIApp, keys: Iterable[str] = (), key: str = "", x_api_key: bool = False,
                 operators: Iterable[str] | None = None) -> None:
        self.app = app
        self.x_api_key = x_api_key
        self._digests = [_digest(k.encode()) for k in (*keys, *([key] if key else []))]
        if not self._digests:
            raise ValueError("RequireAPIKey needs at least one key")
        # several keys: several tenants, each with a prefix cache of its own (api/tenancy.py)
        self._tenants = len(set(self._digests)) > 1
        self._operators = None if operators is None else [_digest(k.encode()) for k in operators]

    def accepts(self, token: bytes) -> bool:
        presented = _digest(token)
        ok = _among(presented, self._digests)
        if ok and self._tenants:
            set_salt(salt_for(presented))
        return ok

    def _check_operator(self, token: bytes) -> None:
        if self._operators is None:
            return
        if not self._operators:
            raise Forbidden(NO_OPERATOR)
        if not _among(_digest(token), self._operators):
            raise Forbidden(NOT_OPERATOR)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            headers = dict(scope["headers"])
            header = headers.get(b"authorization", b"")
            if not header and self.x_api_key and headers.get(b"x-api-key", b"").strip():
                header = b"Bearer " + headers[b"x-api-key"].strip()
            scheme, _, token = header.partition(b" ")
            if scheme.lower() != b"bearer" or not token.strip():
                how = "'x-api-key: <key>' or 'Authorization: Bearer <key>'" if self.x_api_key else \
                    "'Authorization: Bearer <key>'"
                raise Unauthorized(f"Missing API key: send it as {how}.")
            if not self.accepts(token.strip()):
                raise Unauthorized("Incorrect API key provided.")
            self._check_operator(token.strip())
        await self.app(scope, receive, send)


def api_key_guard(settings: Settings, *, x_api_key: bool = False) -> list[Middleware]:
    """Middleware for the /v1 routes: the key check when any key is configured (x_api_key: Anthropic's too)."""
    keys = api_keys(settings)
    return [Middleware(RequireAPIKey, keys=keys, x_api_key=x_api_key)] if keys else []


def ops_guard(settings: Settings) -> list[Middleware]:
    """Middleware for /metrics, /dashboard/state and /health/detail: an operator's key (config/keys.py) when any
    key is configured, unless PROTECT_OPS_ROUTES=false."""
    keys = api_keys(settings)
    if not keys or not settings.PROTECT_OPS_ROUTES:
        return []
    return [Middleware(RequireAPIKey, keys=keys, operators=operator_keys(settings))]
