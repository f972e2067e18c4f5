"""The settings as the engine serves them: the model's name comes from the engine's Info, so `launch.sh switch`
(which restarts the engine only) needs no API restart; the API's own settings name it until the engine answers.

Every dialect reads the served name through `Served`, never from its start-time settings.
"""

from __future__ import annotations

import json
import time

import msgspec

from api.engine_client import EngineClient
from api.errors import APIError, EngineUnavailable
from api.request_checks import MODEL_ALIAS
from config import Settings

REFRESH_TIMEOUT = 1.0  # seconds a request waits for a fresh Info before it goes on with the last one
# A request naming another model asks the engine again at most this often (a switch may have just ended);
# more often would let a client that sends wrong names put an Info request on the engine for each.
MISMATCH_REFRESH_EVERY = 1.0
LATEST = ":latest"
KEPT_NAMES = 8


class Served:
    """Settings whose model_name is the engine's served name (Info.model), kept fresh after the engine was away."""

    def __init__(self, settings: Settings, engine: EngineClient) -> None:
        self.base = settings
        self.engine = engine
        self._by_name: dict[str, Settings] = {settings.model_name: settings}
        self._asked_at = float("-inf")

    def settings(self) -> Settings:
        """From the last Info as it is (no engine round trip)."""
        info = self.engine.last_info
        name = info.model if info is not None and info.model else self.base.model_name
        found = self._by_name.get(name)
        if found is None:
            if len(self._by_name) >= KEPT_NAMES:
                self._by_name = {self.base.model_name: self.base}
            found = self._by_name[name] = msgspec.structs.replace(self.base, SERVED_MODEL_NAME=name)
        return found

    async def fresh(self, wanted: str | None = None) -> Settings:
        """The settings after asking the engine again when it was lost since its last Info, or when the request
        names a model other than the one last served (the engine may have switched to it)."""
        settings = self.settings()
        stale = self.engine.last_info is None or self.engine.stale
        other = wanted is not None and not names(wanted, settings.model_name)
        now = time.monotonic()
        if stale or (other and now - self._asked_at >= MISMATCH_REFRESH_EVERY):
            self._asked_at = now
            try:
                await self.engine.info(REFRESH_TIMEOUT)
            except APIError:
                pass  # the request itself then meets the engine's absence, with its own 503
            settings = self.settings()
        return settings

    def switching(self) -> str | None:
        """The model `launch.sh switch` is changing to, while it does (the last Info then names the old one)."""
        try:
            return str(json.loads(self.base.switch_file.read_text())["model"])
        except (OSError, ValueError, KeyError, TypeError):
            return None

    def refuse_while_switching(self, exc: APIError) -> None:
        """While the engine is away: during a switch the last Info names a model about to go, so say so (503)."""
        if (model := self.switching()) is not None:
            raise EngineUnavailable(f"the engine is switching to the model {model}: {exc.message}") from None


class DialectRoutes:
    """What a dialect's endpoints share: the served settings, the settings that do not follow the engine's model
    (limits, timeouts), and the engine client."""

    def __init__(self, served: Served, engine: EngineClient) -> None:
        self.served = served
        self.settings = served.base
        self.engine = engine


def names(wanted: str, served: str) -> bool:
    """Whether a request's model names the served one: its name or "default", with or without Ollama's tag."""
    accepted = {served, served.removesuffix(LATEST), MODEL_ALIAS}
    return wanted in accepted or wanted.removesuffix(LATEST) in accepted
