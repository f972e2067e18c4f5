"""The live dashboard: one static page (plain JS, no build step) and the JSON it polls.

The page polls /dashboard/state once a second rather than holding a server-sent event stream
open: an open stream would hold every API restart for the graceful-shutdown delay. Its chat
box streams through the API's own /v1/chat/completions like any client. The links between ranks
come with /health's body; the models on each host and a transfer's progress from RUN_DIR's files
(api/cluster_files.py).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import anyio
from starlette.requests import Request
from starlette.responses import FileResponse, Response
from starlette.routing import BaseRoute, Mount, Route
from starlette.staticfiles import StaticFiles

from api import health
from api.cluster_files import read_models, read_transfer
from api.access import Completed
from api.engine_client import EngineClient
from api.metrics import Metrics
from api.bodies import encode
from config import Settings

STATIC_DIR = Path(__file__).resolve().parent / "static"
# The sparkline's rate is the mean over this many complete seconds.
RATE_WINDOW = 3


def _row(d: Completed) -> dict[str, Any]:
    return {
        "id": d.request_id,
        "time": d.time,
        "endpoint": d.endpoint,
        "status": d.status,
        "prompt_tokens": d.prompt_tokens,
        "completion_tokens": d.completion_tokens,
        "ttft": None if d.ttft is None else round(d.ttft, 4),
        "duration": round(d.duration, 4),
        "outcome": d.outcome,
    }


class Dashboard:
    """Serves the page, its static files and its live state."""

    def __init__(self, settings: Settings, engine: EngineClient, metrics: Metrics) -> None:
        self.settings = settings
        self.engine = engine
        self.metrics = metrics
        self.started = time.monotonic()

    def routes(self, middleware: list) -> list[BaseRoute]:
        return [
            # The page shell carries no data and must load in a browser that cannot send a Bearer
            # header; it asks for the key on a 401 from /dashboard/state, which holds everything.
            Route("/dashboard", self.page, methods=["GET"]),
            Route("/dashboard/state", self.state, methods=["GET"], middleware=middleware),
            Mount("/dashboard/static", StaticFiles(directory=STATIC_DIR)),
        ]

    async def page(self, request: Request) -> Response:
        return FileResponse(STATIC_DIR / "dashboard.html", headers={"Cache-Control": "no-cache"})

    async def state(self, request: Request) -> Response:
        return Response(encode(await self.snapshot()), media_type="application/json",
                        headers={"Cache-Control": "no-store"})

    async def snapshot(self) -> dict[str, Any]:
        """Everything the page shows, in one JSON object."""
        status, body = await health.check(self.engine, self.settings, self.started)
        m = self.metrics
        series = m.rate.series()
        ttfts = [d.ttft for d in m.recent if d.ttft is not None]
        last = self.engine.last_info
        return {
            "time": time.time(),
            # the engine's name for its model (a switch changes it under this API), the API's before it answered
            "served_model": last.model if last and last.model else self.settings.model_name,
            "health": {**body, "http_status": status},
            "model": body.get("model") or (last.model if last else self.settings.model_name),
            "tokens_per_second": sum(series[-RATE_WINDOW:]) / RATE_WINDOW,
            "tokens_series": series,
            "generated_total": m.generated_total,
            "requests_total": m.requests_total,
            "engine_reconnects": self.engine.reconnects,
            "ttft": {"last": ttfts[-1] if ttfts else None, "mean": sum(ttfts) / len(ttfts) if ttfts else None},
            "recent": [_row(d) for d in reversed(m.recent)],
            "errors": [_row(d) for d in reversed(m.errors)],
            **await anyio.to_thread.run_sync(self._files),
        }

    def _files(self) -> dict[str, Any]:
        run_dir = self.settings.run_dir
        return {"models": read_models(run_dir), "transfer": read_transfer(run_dir)}
