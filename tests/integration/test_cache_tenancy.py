"""With several API keys, each key has a prefix cache of its own: what one key finds cached (`cached_tokens`,
Anthropic's `cache_read_input_tokens`) never depends on another key's prompts, so no key can test guesses
against another's secret. One key still reuses its own prompts.
"""

from __future__ import annotations

import httpx
import pytest

from tests.harness import Stack

KEY_A, KEY_B = "sk-tenant-a-0001", "sk-tenant-b-0002"
# a secret per test, and wrong guesses that share no first letter with any secret or with each other, so
# each of key B's guesses shares with B's own earlier prompts exactly "The passphrase is "
SECRETS = {"chat": "swordfish-7391-quartz", "anthropic": "marmalade-2208-basalt"}
WRONG = {"chat": ("guess-0000", "kumquat-1111"), "anthropic": ("otter-2222", "velvet-3333")}
DOCUMENT = " ".join(f"Clause {i}: the tenant keeps record {i * 7 % 31} for audit." for i in range(120))


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    keys = tmp_path_factory.mktemp("keys") / "keys.txt"
    keys.write_text(f"{KEY_A}\n{KEY_B}\n")
    s = Stack(extra={"API_KEYS_FILE": str(keys)})
    engine, api = s.start_engine(), s.start_api()
    yield s
    api.stop()
    engine.stop()


def system(passphrase: str) -> str:
    return f"The passphrase is {passphrase}. Never reveal it.\n\n{DOCUMENT}"


def chat_cached(stack: Stack, key: str, passphrase: str, question: str) -> int:
    r = httpx.post(stack.base_url + "/v1/chat/completions", timeout=300, headers={"Authorization": f"Bearer {key}"},
                   json={"model": "default", "max_tokens": 2, "temperature": 0, "messages": [
                       {"role": "system", "content": system(passphrase)}, {"role": "user", "content": question}]})
    assert r.status_code == 200, r.text
    return r.json()["usage"]["prompt_tokens_details"]["cached_tokens"]


def messages_cached(stack: Stack, key: str, passphrase: str, question: str) -> int:
    r = httpx.post(stack.base_url + "/v1/messages", timeout=300, headers={"x-api-key": key},
                   json={"model": "default", "max_tokens": 2, "system": system(passphrase),
                         "messages": [{"role": "user", "content": question}]})
    assert r.status_code == 200, r.text
    return r.json()["usage"]["cache_read_input_tokens"]


@pytest.mark.parametrize("dialect", ["chat", "anthropic"])
def test_another_keys_cached_tokens_do_not_tell_a_right_guess_from_a_wrong_one(stack, dialect):
    cached = {"chat": chat_cached, "anthropic": messages_cached}[dialect]
    question = "Summarise clause 3."
    chat_cached(stack, KEY_A, SECRETS[dialect], question)  # key A's secret is now in A's cache
    # key B's guesses: the right one must find no more cached than a wrong one sent after it
    wrong_first = cached(stack, KEY_B, WRONG[dialect][0], question)
    right = cached(stack, KEY_B, SECRETS[dialect], question)
    wrong_after = cached(stack, KEY_B, WRONG[dialect][1], question)
    assert right == wrong_after, (
        f"key B's right guess found {right} tokens cached, a wrong one {wrong_after} (first guess: {wrong_first})")


def test_a_key_still_reuses_its_own_prompts(stack):
    chat_cached(stack, KEY_A, "own-prefix", "First question.")
    again = chat_cached(stack, KEY_A, "own-prefix", "Second question.")
    assert again > len(DOCUMENT) // 4  # the system prompt and document came from the cache
