"""http(s) image URLs against a real HTTP server on loopback: fetched only where IMAGE_URL_FETCH=on and the
test hook allows loopback, refused by default as a loopback address, with redirects, size and time limits."""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from api.errors import InvalidRequest
from api.images import ImageRef, resolve_images
from config import load_settings
from ipc import test_hooks
from tests.images import JPEG, PNG

pytestmark = pytest.mark.anyio

FIELD = "messages[0].content[0].image_url"
_release = threading.Event()  # /hang answers once the test is over


class _Handler(BaseHTTPRequestHandler):
    ROUTES = {"/cat.png": PNG, "/big.jpg": JPEG}

    def do_GET(self) -> None:  # noqa: N802 - http.server's name
        if self.path in self.ROUTES:
            self._send(200, self.ROUTES[self.path], length=self.path != "/big.jpg")
        elif self.path.startswith("/hop"):
            hops = int(self.path[4:] or 1)
            self._redirect(f"/hop{hops - 1}" if hops > 1 else "/cat.png")
        elif self.path == "/elsewhere":
            self._redirect("file:///etc/passwd")
        elif self.path == "/hang":
            _release.wait(30)
        else:
            self._send(404, b"not here")

    def _send(self, status: int, body: bytes, length: bool = True) -> None:
        self.send_response(status)
        if length:
            self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def _redirect(self, where: str) -> None:
        self.send_response(302)
        self.send_header("Location", where)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture(scope="module")
def server() -> Iterator[str]:
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    httpd.daemon_threads = True
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}"
    _release.set()
    httpd.shutdown()
    httpd.server_close()
    thread.join(10)


async def fetched(url: str, allow_loopback: bool | None = True, **overrides: object) -> dict:
    settings = load_settings(environ={"MODEL": "test-model", "IMAGE_URL_FETCH": "on",
                                      **{k: str(v) for k, v in overrides.items()}}, env_file=os.devnull)
    messages = [{"role": "user", "content": [ImageRef("url", url, FIELD)]}]
    await resolve_images(messages, settings, allow_loopback=allow_loopback)
    return messages[0]["content"][0]


async def refused(url: str, allow_loopback: bool | None = True, **overrides: object) -> str:
    with pytest.raises(InvalidRequest) as info:
        await fetched(url, allow_loopback, **overrides)
    assert info.value.status == 400 and info.value.param == FIELD
    return info.value.message


async def test_an_image_url_is_fetched_where_the_hook_allows_loopback(server):
    part = await fetched(server + "/cat.png")
    assert (part["media_type"], part["width"], part["height"], part["data"]) == ("image/png", 3, 2, PNG)
    assert (await fetched(server + "/hop3"))["data"] == PNG  # three redirects are followed


async def test_loopback_is_refused_by_default(server, monkeypatch):
    message = await refused(server + "/cat.png", allow_loopback=None)
    assert "resolves to 127.0.0.1, a loopback address" in message
    # the hook takes effect only with the test-hooks switch
    monkeypatch.setenv("MCS_IMAGE_FETCH_ALLOW_LOOPBACK", "1")
    assert "loopback" in await refused(server + "/cat.png", allow_loopback=None)
    monkeypatch.setattr(test_hooks, "ENABLED", True)
    assert (await fetched(server + "/cat.png", allow_loopback=None))["data"] == PNG


async def test_fetching_is_off_unless_set(server):
    assert "IMAGE_URL_FETCH=off" in await refused(server + "/cat.png", IMAGE_URL_FETCH="off")


@pytest.mark.parametrize(("path", "says", "settings"), [
    ("/hop4", "redirected more than 3 times", {}),
    ("/elsewhere", "only http(s) URLs", {}),
    ("/missing", "HTTP 404", {}),
    ("/cat.png", "MAX_IMAGE_BYTES", {"MAX_IMAGE_BYTES": len(PNG) - 1}),  # declared by Content-Length
    ("/big.jpg", "MAX_IMAGE_BYTES", {"MAX_IMAGE_BYTES": 100}),  # no length: counted as it arrives
    ("/hang", "IMAGE_URL_TIMEOUT", {"IMAGE_URL_TIMEOUT": 0.3}),
])
async def test_what_the_fetch_refuses(server, path, says, settings):
    assert says in await refused(server + path, **settings)


async def test_a_port_with_nothing_listening_is_a_400(server):
    assert "could not be fetched" in await refused("http://127.0.0.1:1/cat.png")
