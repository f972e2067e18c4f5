"""Who gets in: API keys, the private socket, one engine per socket, no model or file chosen by a
request, and the request limits (messages, max_tokens, context) checked before admission."""

from __future__ import annotations

import stat
import subprocess
import sys
import urllib.parse

import httpx
import pytest
from starlette.applications import Starlette
from starlette.responses import PlainTextResponse
from starlette.routing import Route

from api.auth import ops_guard
from api.errors import APIError
from config import load_settings
from tests.harness import REPO, Stack

MESSAGES = [{"role": "user", "content": "hello"}]


def test_the_socket_is_private_and_a_second_engine_refuses_to_take_it_over(stack):
    assert stat.S_IMODE(stack.socket.stat().st_mode) == 0o600
    assert stat.S_IMODE(stack.socket.parent.stat().st_mode) == 0o700
    before = stack.probe()["engine_pid"]
    second = subprocess.run([sys.executable, "-m", "engine"], cwd=REPO, env=stack.env(), capture_output=True,
                            text=True, timeout=60, stdin=subprocess.DEVNULL)
    assert second.returncode == 1
    assert "already serving" in second.stderr
    assert stack.probe()["engine_pid"] == before


@pytest.fixture(scope="module")
def keyed(stack, tmp_path_factory):
    """A second API on the session's engine, with API_KEY and an API_KEYS_FILE."""
    keys = tmp_path_factory.mktemp("keys") / "keys.txt"
    keys.write_text("# one key per line\n\nfile-key-1\n  file-key-2  \n")
    admin = keys.with_name("admin.txt")
    admin.write_text("ops-key\n")
    s = Stack(root=stack.root, extra={"API_KEY": "env-key", "API_KEYS_FILE": str(keys), "ADMIN_API_KEYS_FILE": str(admin)})
    api = s.start_api()
    yield s
    api.stop()


@pytest.mark.parametrize("header", [None, "Bearer wrong", "Bearer", "Basic file-key-1", "file-key-1",
                                    "Bearer file-key-1x", "Bearer # one key per line"])
def test_v1_routes_refuse_a_missing_or_wrong_key(keyed, header):
    headers = {"Authorization": header} if header is not None else {}
    for method, path, body in [("POST", "/v1/chat/completions", {"model": "default", "messages": MESSAGES}),
                               ("POST", "/v1/completions", {"model": "default", "prompt": "hi"}),
                               ("GET", "/v1/models", None), ("GET", "/v1/models/default", None),
                               ("GET", "/v1/no-such-route", None)]:
        r = httpx.request(method, keyed.base_url + path, json=body, headers=headers, timeout=10)
        assert r.status_code == 401, (path, r.text)
        assert r.headers["WWW-Authenticate"] == "Bearer"
        error = r.json()["error"]
        assert error["code"] == "invalid_api_key" and error["type"] == "invalid_request_error" and error["message"]


@pytest.mark.parametrize("key", ["env-key", "file-key-1", "file-key-2"])
def test_every_configured_key_is_accepted(keyed, key):
    headers = {"Authorization": f"Bearer {key}"}
    assert httpx.get(keyed.base_url + "/v1/models", headers=headers, timeout=10).status_code == 200
    r = httpx.post(keyed.base_url + "/v1/completions", headers=headers, timeout=30,
                   json={"model": "default", "prompt": "hi", "max_tokens": 2})
    assert r.status_code == 200


def test_health_and_the_openapi_document_stay_open(keyed):
    assert httpx.get(keyed.base_url + "/health", timeout=10).status_code == 200
    doc = httpx.get(keyed.base_url + "/openapi.json", timeout=10).json()
    assert doc["components"]["securitySchemes"]["bearerAuth"]["scheme"] == "bearer"
    assert doc["paths"]["/v1/chat/completions"]["post"]["security"] == [{"bearerAuth": []}]
    assert "security" not in doc["paths"]["/health"]["get"]


def test_metrics_need_an_operators_key(keyed):
    assert httpx.get(keyed.base_url + "/metrics", timeout=10).status_code == 401
    r = httpx.get(keyed.base_url + "/metrics", headers={"Authorization": "Bearer file-key-2"}, timeout=10)
    assert r.status_code == 403
    r = httpx.get(keyed.base_url + "/metrics", headers={"Authorization": "Bearer ops-key"}, timeout=10)
    assert r.status_code == 200


def test_dashboard_shell_loads_in_a_browser_but_its_data_needs_the_operators_key(keyed):
    page = httpx.get(keyed.base_url + "/dashboard", timeout=10)
    assert page.status_code == 200 and "<html" in page.text.lower()
    assert httpx.get(keyed.base_url + "/dashboard/state", timeout=10).status_code == 401
    r = httpx.get(keyed.base_url + "/dashboard/state", headers={"Authorization": "Bearer file-key-2"}, timeout=10)
    assert r.status_code == 403
    r = httpx.get(keyed.base_url + "/dashboard/state", headers={"Authorization": "Bearer ops-key"}, timeout=10)
    assert r.status_code == 200 and "ranks" in r.text


@pytest.mark.anyio
@pytest.mark.parametrize(("protect", "key", "status"), [("true", "", 401), ("true", "k", 200),
                                                        ("false", "", 200), ("false", "bad", 200)])
async def test_ops_guard_is_a_reusable_piece(protect, key, status):
    """What /metrics and /dashboard get from api.auth.ops_guard, on any route."""
    settings = load_settings({"API_KEY": "k", "PROTECT_OPS_ROUTES": protect}, "/nonexistent/.env")

    async def ops(request):
        return PlainTextResponse("ops")

    async def as_json(request, exc):
        return PlainTextResponse(exc.message, status_code=exc.status)

    app = Starlette(routes=[Route("/ops", ops, middleware=ops_guard(settings))], exception_handlers={APIError: as_json})
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t") as client:
        assert (await client.get("/ops", headers=headers)).status_code == status


def test_no_key_configured_means_no_guard():
    settings = load_settings({"PROTECT_OPS_ROUTES": "true"}, "/nonexistent/.env")
    assert ops_guard(settings) == []


@pytest.mark.parametrize(("content", "says"), [("", "no key"), ("# only a comment\n\n   \n", "no key"),
                                             (None, "cannot be read")])
def test_an_api_with_a_bad_api_keys_file_refuses_to_start(tmp_path, content, says):
    keys = tmp_path / "keys.txt"
    if content is not None:
        keys.write_text(content)
    s = Stack()  # a short folder: the socket path must stay short even if nothing binds it
    r = subprocess.run([sys.executable, "-m", "api"], cwd=REPO, capture_output=True, text=True, timeout=60,
                       env=s.env(API_KEYS_FILE=str(keys)), stdin=subprocess.DEVNULL)
    assert r.returncode == 2 and "API_KEYS_FILE" in r.stderr and says in r.stderr, r.stderr


OTHER_MODELS = ["/etc/passwd", "../../../etc/passwd", "~/.ssh/id_rsa", "file:///etc/passwd",
                "mlx-community/Qwen3-4B-Instruct-2507-4bit", "default/../demo-tiny", "demo-tiny\x00", ""]


@pytest.mark.parametrize("model", OTHER_MODELS)
def test_a_request_cannot_name_another_model_or_a_path(stack, model):
    for path, body in [("/v1/chat/completions", {"model": model, "messages": MESSAGES}),
                       ("/v1/completions", {"model": model, "prompt": "hi"})]:
        r = httpx.post(stack.base_url + path, json=body, timeout=10)
        assert r.status_code == 404, (path, r.text)
        assert r.json()["error"]["code"] == "model_not_found"
    if model:
        r = httpx.get(stack.base_url + "/v1/models/" + urllib.parse.quote(model, safe=""), timeout=10)
        assert r.status_code == 404


def test_paths_in_prompts_are_only_text(stack):
    """A prompt naming a file is tokenised as written; nothing is read from disk."""
    r = httpx.post(stack.base_url + "/v1/chat/completions", timeout=30,
                   json={"model": "default", "max_tokens": 2,
                         "messages": [{"role": "system", "content": "/etc/passwd"},
                                      {"role": "user", "content": "file:///etc/hostname ../../etc/shadow"}]})
    assert r.status_code == 200
    assert r.json()["usage"]["prompt_tokens"] < 60  # /etc/passwd alone is hundreds of tokens
    r = httpx.post(stack.base_url + "/v1/completions", timeout=30,
                   json={"model": "default", "prompt": "/etc/passwd", "max_tokens": 2})
    assert r.status_code == 200 and r.json()["usage"]["prompt_tokens"] < 20


def test_too_many_messages_is_a_400_naming_messages(stack):
    messages = [{"role": "user", "content": "x"}] * 2049  # MAX_MESSAGES defaults to 2048
    r = httpx.post(stack.base_url + "/v1/chat/completions", timeout=30,
                   json={"model": "default", "messages": messages, "max_tokens": 1})
    assert r.status_code == 400
    assert r.json()["error"]["param"] == "messages" and "MAX_MESSAGES" in r.json()["error"]["message"]


@pytest.mark.parametrize("param", ["max_tokens", "max_completion_tokens"])
def test_max_tokens_over_the_ceiling_is_a_400(stack, param):
    r = httpx.post(stack.base_url + "/v1/chat/completions", timeout=30,
                   json={"model": "default", "messages": MESSAGES, param: 32769})  # MAX_TOKENS_LIMIT 32768
    assert r.status_code == 400 and r.json()["error"]["param"] == param


def test_a_chat_longer_than_the_context_is_refused_before_admission(stack):
    info = stack.probe()
    long = "hello " * (info["context_length"] + 100)
    r = httpx.post(stack.base_url + "/v1/chat/completions", timeout=60,
                   json={"model": "default", "messages": [{"role": "user", "content": long}], "max_tokens": 1})
    assert r.status_code == 400
    assert r.json()["error"]["code"] == "context_length_exceeded" and r.json()["error"]["param"] == "messages"
    assert stack.probe()["active"] == 0
    # The refusal is the whole story: the engine log does not warn of errors that never happen.
    logs = "".join(log.read_text(errors="replace") for log in stack.root.glob("**/engine*.log"))
    assert "indexing errors" not in logs
