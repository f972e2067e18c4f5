"""The demo model: reproducible to the byte, loadable by mlx-lm, with a working ChatML tokenizer."""

from __future__ import annotations

import hashlib
import subprocess
import sys
from pathlib import Path

import pytest

from engine.demo import DEMO_MODELS, MARKER_FILE, demo_model_path, ensure_demo_model

REPO_ROOT = Path(__file__).resolve().parents[2]


def _dirs(path: Path) -> list[str]:
    """Directories in a cache dir: the models, and any temporary copy left behind."""
    return sorted(p.name for p in path.iterdir() if p.is_dir())


def _digests(path: Path) -> dict[str, str]:
    return {f.name: hashlib.sha256(f.read_bytes()).hexdigest() for f in sorted(path.iterdir())}


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return ensure_demo_model("tiny", tmp_path_factory.mktemp("cache"))


@pytest.fixture(scope="module")
def loaded(tiny: Path):
    from mlx_lm import load

    return load(str(tiny))


def test_generation_is_byte_identical(tiny: Path, tmp_path: Path) -> None:
    again = ensure_demo_model("tiny", tmp_path)
    assert again == demo_model_path("tiny", tmp_path) and again.name == tiny.name
    digests = _digests(tiny)
    assert {"config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json", MARKER_FILE} <= set(digests)
    assert _digests(again) == digests


def test_existing_model_is_reused(tiny: Path) -> None:
    before = (tiny / "model.safetensors").stat().st_mtime_ns
    assert ensure_demo_model("tiny", tiny.parent) == tiny
    assert (tiny / "model.safetensors").stat().st_mtime_ns == before


def test_concurrent_generation_through_the_cli(tmp_path: Path) -> None:
    # Two local ranks starting at once both generate; one rename wins, the other copy is dropped.
    cmd = [sys.executable, "-m", "engine.demo", "--size", "tiny", "--cache-dir", str(tmp_path)]
    procs = [subprocess.Popen(cmd, cwd=REPO_ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for _ in range(2)]
    outs = [p.communicate(timeout=120) for p in procs]
    for p, (out, err) in zip(procs, outs):
        assert p.returncode == 0, err
        assert out.strip() == str(demo_model_path("tiny", tmp_path))
    assert _dirs(tmp_path) == [demo_model_path("tiny", tmp_path).name]


def test_loser_of_the_rename_race_discards_its_copy(tiny: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Deterministic version of the race: this caller sees no model, generates one, and finds
    # the target already in place when it renames.
    from engine.modelgen import store

    real, calls = store._is_complete, []

    def blind_first_time(path: Path, *args) -> bool:
        calls.append(path)
        return len(calls) > 1 and real(path, *args)

    monkeypatch.setattr(store, "_is_complete", blind_first_time)
    before = _digests(tiny)
    assert ensure_demo_model("tiny", tiny.parent) == tiny
    assert len(calls) > 1 and _digests(tiny) == before
    assert _dirs(tiny.parent) == [tiny.name]


def test_unfinished_directory_is_replaced(tmp_path: Path) -> None:
    target = demo_model_path("tiny", tmp_path)
    target.mkdir()
    (target / "config.json").write_text("{}")  # no marker: a leftover, never used as is
    assert ensure_demo_model("tiny", tmp_path) == target
    assert (target / MARKER_FILE).exists() and (target / "model.safetensors").exists()
    assert _dirs(tmp_path) == [target.name]


def test_unknown_name_lists_accepted_names(tmp_path: Path) -> None:
    with pytest.raises(ValueError) as info:
        ensure_demo_model("huge", tmp_path)
    assert all(name in str(info.value) for name in DEMO_MODELS)
    with pytest.raises(ValueError):
        demo_model_path("huge", tmp_path)
    assert not any(tmp_path.iterdir())


def test_chat_template_renders_chatml(loaded) -> None:
    _, tokenizer = loaded
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hello"}]
    text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    assert text == "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nhello<|im_end|>\n<|im_start|>assistant\n"
    ids = tokenizer.apply_chat_template(messages[1:], add_generation_prompt=True)
    assert tokenizer.decode(ids) == "<|im_start|>user\nhello<|im_end|>\n<|im_start|>assistant\n"


def test_chat_template_renders_tools_and_tool_calls(loaded) -> None:
    _, tokenizer = loaded
    tools = [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}]
    messages = [
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": "", "tool_calls": [{"type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}]},
        {"role": "tool", "content": '{"t": 18}'},
    ]
    text = tokenizer.apply_chat_template(messages, tools=tools, add_generation_prompt=True, tokenize=False)
    assert '<tools>\n{"type": "function", "function": {"name": "get_weather"' in text
    assert '<|im_start|>assistant\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call><|im_end|>\n' in text
    assert '<|im_start|>user\n<tool_response>\n{"t": 18}\n</tool_response><|im_end|>\n' in text
    assert text.endswith("<|im_start|>assistant\n")


def test_tokenizer_special_tokens(loaded) -> None:
    _, tokenizer = loaded
    vocab = tokenizer.get_vocab()
    assert vocab["<|im_end|>"] in tokenizer.eos_token_ids
    assert tokenizer.has_tool_calling and tokenizer.tool_call_start == "<tool_call>"
    assert len(tokenizer.tool_call_start_tokens) == 1 and len(tokenizer.tool_call_end_tokens) == 1
    assert tokenizer.has_thinking and tokenizer.think_start_id == vocab["<think>"]
    assert tokenizer.tool_parser('{"name": "f", "arguments": {}}') == {"name": "f", "arguments": {}}


UNICODE = "héllo wörld, 世界! 🙂\n\t{\"a\": [1, 2]} ∑ x²"


@pytest.mark.parametrize("text", [UNICODE, "  two leading spaces", "ÿ\u0000\u200b"])
def test_tokenizer_round_trips_unicode(loaded, text: str) -> None:
    _, tokenizer = loaded
    assert tokenizer.decode(tokenizer.encode(text, add_special_tokens=False)) == text


def test_streaming_detokenizer_matches_decode(loaded) -> None:
    # Only for text without a leading space (mlx-lm's BPE detokenizer drops the first one, like
    # SentencePiece) and without NUL (it turns byte 0 into "Ā"): both are mlx-lm's, not ours.
    _, tokenizer = loaded
    detokenizer = tokenizer.detokenizer
    assert type(detokenizer).__name__ == "BPEStreamingDetokenizer"
    detokenizer.reset()
    for token in tokenizer.encode(UNICODE, add_special_tokens=False):
        detokenizer.add_token(token)
    detokenizer.finalize()
    assert detokenizer.text == UNICODE


def test_greedy_output_is_varied_and_does_not_stop(loaded) -> None:
    from mlx_lm import stream_generate
    from mlx_lm.sample_utils import make_sampler

    model, tokenizer = loaded
    prompt = tokenizer.apply_chat_template([{"role": "user", "content": "hello"}], add_generation_prompt=True)
    tokens = [r.token for r in stream_generate(model, tokenizer, prompt, max_tokens=32, sampler=make_sampler(temp=0.0))]
    assert len(tokens) == 32
    assert len(set(tokens)) > 8
    assert not set(tokens) & tokenizer.eos_token_ids
