"""The coding-agent CLIs themselves, headless, against the real engine and API on the demo model.

Claude Code speaks /v1/messages, Codex CLI /v1/responses; both send agent requests (a long system prompt
and tool schemas). Claude Code is given three of its tools (CLAUDE_TOOLS): all 24 make a ~40k-token prompt
of the demo tokenizer whose prefill takes minutes on a CPU (its request timed out at 300 s, twice, on a
loaded host); every one of its 24 schemas is compiled in every tool-call format by
test_agent_tool_grammars.py, and bench/agent_replay.py replays the full-size turns. The CLIs
come from the npm registry at the versions tests/agents/package.json pins: .ci/run installs them,
and these tests install them when npm is present and they are missing.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import httpx
import pytest

from tests.harness import REPO, Stack

AGENTS = REPO / "tests" / "agents"
BIN = AGENTS / "node_modules" / ".bin"
# Generous: the first turn prefills the whole agent prompt on one CPU core (minutes here, seconds on a Mac).
CLI_TIMEOUT = 900.0
# Claude Code's own output cap (CLAUDE_CODE_MAX_OUTPUT_TOKENS). The demo model seldom ends a turn by itself:
# uncapped, the turn ran to ~3,600 tokens, 80 s of decoding here that tested nothing more. Capped, Claude
# Code asks to continue a cut answer, which also takes it through the prefix cache. (Codex CLI has no
# such setting, and it fails on a response cut by the server's limit, so its turn runs to the end.)
OUTPUT_TOKENS = 64
# Codex's own ~17k-character instructions and its bundled skills' list were half of its ~18.7k-token request,
# prefilled and attended to by every one of the ~1,700 tokens the demo model decoded to its end (154 s in CI).
# A short instructions file keeps the request's shape: the same tools, messages and wire fields.
CODEX_INSTRUCTIONS = "You are Codex, a coding agent in a terminal. Be concise.\n"
CLAUDE_TOOLS = "Bash,Read,Edit"  # a ~7k-token request: the shape of the full one at a sixth of its length


@pytest.fixture(scope="module")
def clis() -> Path:
    if shutil.which("npm") is None:
        pytest.skip("npm is not installed: the agent CLIs come from the npm registry")
    if not ((BIN / "claude").exists() and (BIN / "codex").exists()):
        r = subprocess.run(["npm", "ci", "--no-audit", "--no-fund"], cwd=AGENTS, capture_output=True, text=True,
                           timeout=600, stdin=subprocess.DEVNULL)
        assert r.returncode == 0, f"npm ci in {AGENTS} failed:\n{r.stdout[-2000:]}\n{r.stderr[-2000:]}"
    return BIN


@pytest.fixture(scope="module")
def stack():
    # No server-chosen output cap (the product's default): Codex sends no max_output_tokens and fails on a
    # response the server cut short, so its turn must run to the model's own end, as against OpenAI.
    s = Stack(extra={"MAX_TOKENS_DEFAULT": "0"})
    engine, api = s.start_engine(), s.start_api()
    yield s
    api.stop()
    engine.stop()


@pytest.fixture(scope="module")
def model(stack) -> str:
    return httpx.get(stack.base_url + "/v1/models", timeout=10).json()["data"][0]["id"]


def _run(cmd: list[str], env: dict[str, str], cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, env=env, cwd=cwd, capture_output=True, text=True, timeout=CLI_TIMEOUT,
                          stdin=subprocess.DEVNULL)


def _log_sizes(stack) -> dict[Path, int]:
    return {log: log.stat().st_size for log in stack.root.glob("**/api*.log")}


def _served(stack, path: str, since: dict[Path, int] | None = None) -> list[str]:
    """The access-log lines of the stack's API for requests to path (written after the since snapshot)."""
    lines = []
    for log in stack.root.glob("**/api*.log"):
        text = log.read_bytes()[(since or {}).get(log, 0):].decode(errors="replace")
        lines += [line for line in text.splitlines() if f" {path}" in line]
    return lines


def _agent_env(home: Path, **more: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ANTHROPIC_", "OPENAI_", "CODEX_", "CLAUDE_"))}
    env.update(HOME=str(home), **more)
    return env


def _claude_env(home: Path, stack) -> dict[str, str]:
    return _agent_env(home, ANTHROPIC_BASE_URL=stack.base_url, ANTHROPIC_AUTH_TOKEN="unused",
                      CLAUDE_CODE_MAX_OUTPUT_TOKENS=str(OUTPUT_TOKENS),
                      # one attempt, bounded by our own timeout: its default 300 s then a retry from scratch
                      API_TIMEOUT_MS=str(int(CLI_TIMEOUT * 1000)),
                      DISABLE_TELEMETRY="1", DISABLE_AUTOUPDATER="1", CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC="1")


def test_claude_code_prints_the_models_answer(clis, stack, model, tmp_path):
    # The demo model's answer depends on Claude Code's prompt, which names the date and the working
    # directory: it may be only whitespace or an end-of-sequence token. So read the result as JSON,
    # which says whether the turn succeeded and how many tokens the model produced, whatever they were.
    env = _claude_env(tmp_path, stack)
    before = _log_sizes(stack)
    r = _run([str(clis / "claude"), "-p", "Say hello in one word.", "--model", model, "--output-format", "json",
              "--tools", CLAUDE_TOOLS], env, tmp_path)
    try:
        result = json.loads(r.stdout)
    except ValueError:
        raise AssertionError(f"claude exited {r.returncode} and printed no JSON result:\n{r.stdout[-3000:]}\n"
                             f"{r.stderr[-3000:]}") from None
    assert result.get("type") == "result" and result.get("subtype") == "success", result
    assert isinstance(result.get("result"), str), result
    usage = result["usage"]
    assert usage["output_tokens"] >= 1, f"claude saw no tokens from the model: {result}"
    assert usage["input_tokens"] + usage.get("cache_read_input_tokens", 0) > 1000, result
    served = [line for line in _served(stack, "/v1/messages", since=before) if " POST " in line]
    assert served and all(" 200 " in line for line in served), served
    # Two endings, both Claude Code working as it does against Anthropic: the model ends the turn
    # within the cap (exit 0), or every answer is cut at the cap (stop_reason max_tokens), Claude Code
    # asks to continue a few times, each time reusing the cached prefix, then reports the cap (exit 1).
    if r.returncode != 0:
        assert result["is_error"] is True and f"exceeded the {OUTPUT_TOKENS} output token maximum" in result["result"], \
            f"claude exited {r.returncode}:\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}"
        assert len(served) > 1 and usage["output_tokens"] == len(served) * OUTPUT_TOKENS, (served, usage)
        assert usage["cache_read_input_tokens"] > 0, f"the continuations did not reuse the cached prompt: {usage}"
    else:
        assert result["is_error"] is False, result


def test_codex_exec_ends_with_a_last_message(clis, stack, model, tmp_path):
    home = tmp_path / "codex"
    home.mkdir()
    (home / "config.toml").write_text(
        f'model = "{model}"\n'
        'model_provider = "local"\n'
        f'model_instructions_file = "{home / "instructions.md"}"\n\n'
        "[model_providers.local]\n"
        'name = "mlx-cluster-serve"\n'
        f'base_url = "{stack.base_url}/v1"\n'
        'wire_api = "responses"\n\n'
        "[skills.bundled]\n"
        "enabled = false\n"
    )
    (home / "instructions.md").write_text(CODEX_INSTRUCTIONS)
    last = tmp_path / "last-message.txt"
    env = _agent_env(tmp_path, CODEX_HOME=str(home))
    r = _run([str(clis / "codex"), "exec", "--skip-git-repo-check", "--output-last-message", str(last),
              "Say hello in one word."], env, tmp_path)
    assert r.returncode == 0, f"codex exited {r.returncode}:\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}"
    assert last.exists(), f"codex wrote no last message:\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}"
    assert any(" 200 " in line for line in _served(stack, "/v1/responses")), "no /v1/responses request succeeded"


VISION_MODEL = "zoo-gemma3-vision"  # a fixed 16 image tokens per picture on the zoo model
# The zoo model's context is 4,096 tokens and Claude Code's own system prompt with three tools ~6,000: a short
# system prompt and its Read tool (what reads an image file) keep the turn's shape within it.


@pytest.fixture(scope="module")
def vision_stack():
    s = Stack(extra={"MAX_TOKENS_DEFAULT": "0"})
    engine, api = s.start_engine(MODEL=VISION_MODEL), s.start_api(MODEL=VISION_MODEL)
    yield s
    api.stop()
    engine.stop()


def _claude_turn(clis: Path, stack, content: list[dict], home: Path) -> list[dict]:
    """One headless Claude Code turn fed a user message as stream-json (how its SDK sends images); its events."""
    env = _claude_env(home, stack)
    line = json.dumps({"type": "user", "message": {"role": "user", "content": content}})
    r = subprocess.run([str(clis / "claude"), "-p", "--input-format", "stream-json", "--output-format", "stream-json",
                        "--verbose", "--model", VISION_MODEL, "--tools", "Read", "--system-prompt", CODEX_INSTRUCTIONS],
                       env=env, cwd=home, input=line + "\n", capture_output=True, text=True, timeout=CLI_TIMEOUT)
    events = [json.loads(x) for x in r.stdout.splitlines() if x.startswith("{")]
    assert events and events[-1].get("type") == "result", \
        f"claude exited {r.returncode}:\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}"
    return events


def _answers(events: list[dict]) -> list[dict]:
    """The model's own messages (Claude Code reports an API error as a message of model "<synthetic>")."""
    return [e["message"] for e in events if e.get("type") == "assistant" and e["message"]["model"] == VISION_MODEL]


def _first_prompt_tokens(events: list[dict]) -> int:
    """The prompt tokens the server counted for the turn's first request (its first answer's usage)."""
    answers = _answers(events)
    assert answers, f"the server answered nothing: {events[-1]}"
    usage = answers[0]["usage"]
    return usage["input_tokens"] + usage.get("cache_read_input_tokens", 0) + usage.get("cache_creation_input_tokens", 0)


def test_claude_code_sends_an_image_block_headless_and_gets_an_answer(clis, vision_stack, tmp_path):
    # Claude Code attaches a screenshot as an Anthropic image block; headless, its stream-json input takes the
    # same block. The same turn without the image is the baseline: the image must add its tokens to the prompt
    # the server counted (the zoo model's 16, and the markers around them: 20 here), and the model must answer.
    from tests.images import b64, image_file

    text = {"type": "text", "text": "What is in this picture? Answer in one word."}
    image = {"type": "image", "source": {"type": "base64", "media_type": "image/png",
                                         "data": b64(image_file("PNG", (64, 48)))}}
    plain = _claude_turn(clis, vision_stack, [text], tmp_path)
    seen = _claude_turn(clis, vision_stack, [image, text], tmp_path)
    added = _first_prompt_tokens(seen) - _first_prompt_tokens(plain)
    assert added >= 16, f"the image added {added} prompt tokens: Claude Code did not carry it"
    # the model's own answer (random weights: any text), whether the turn then ends or runs into the output cap
    assert _answers(seen)[0]["content"] and seen[-1]["usage"]["output_tokens"] >= 1, seen[-1]
