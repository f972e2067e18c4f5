"""The draft proposer: a draft equal to the target proposes the target's own greedy continuation, across steps
and after the target rejects drafts; a draft of another tokenizer is refused in one sentence; a sequence's draft
cache goes when the sequence leaves."""

from __future__ import annotations

import pytest

from config import ConfigError, load_settings
from engine.model import ModelError
from tests.harness import MODEL_CACHE

mx = pytest.importorskip("mlx.core")

from mlx_lm import load as mlx_load  # noqa: E402
from mlx_lm.generate import generate_step  # noqa: E402

from engine.speculative.draft import DraftProposer, tokenizer_mismatch  # noqa: E402


def _settings(tmp_path, **env: str):
    empty = tmp_path / "empty.env"
    empty.touch()
    return load_settings({"MODEL_CACHE_DIR": str(MODEL_CACHE), "SPECULATIVE": "draft", **env}, env_file=empty)


@pytest.fixture(scope="module")
def llama(tmp_path_factory):
    """zoo-llama as both target and draft, and the target loaded apart to decode plainly."""
    settings = _settings(tmp_path_factory.mktemp("s"), MODEL="zoo-llama", DRAFT_MODEL="zoo-llama")
    from engine.model import resolve

    model, tokenizer = mlx_load(str(resolve(settings)))
    return settings, model, tokenizer


def _greedy(model, history: list[int], n: int) -> list[int]:
    """Plain greedy decoding with mlx-lm: what the target would say after history."""
    steps = generate_step(mx.array(history), model, max_tokens=n)
    return [int(token) for token, _ in steps]


def test_a_draft_equal_to_the_target_proposes_its_greedy_continuation(llama) -> None:
    settings, model, tokenizer = llama
    proposer = DraftProposer(settings, tokenizer)
    prompt = tokenizer.encode("Tell me a story about a cluster of Macs, and of the link between them.")
    other = tokenizer.encode("A second request, shorter.")
    want = _greedy(model, prompt, 12)

    got = proposer.propose({"a": prompt, "b": other}, 4)
    assert got == {"a": want[:4], "b": _greedy(model, other, 4)}
    # every draft accepted, then the target's own next token: the draft continues from there
    assert proposer.propose({"a": prompt + want[:5]}, 4) == {"a": want[5:9]}
    # the target rejected the drafts after the first and chose another token: the draft follows the target's
    # history, not its own last proposal
    other_token = (want[6] + 1) % 1000
    diverged = prompt + want[:6] + [other_token]
    assert proposer.propose({"a": diverged}, 4) == {"a": _greedy(model, diverged, 4)}
    # and a history shorter than what the draft has seen (the same request id, restarted)
    assert proposer.propose({"a": prompt}, 3) == {"a": want[:3]}


def test_forgotten_sequences_free_their_draft_caches(llama) -> None:
    settings, model, tokenizer = llama
    proposer = DraftProposer(settings, tokenizer)
    a, b = tokenizer.encode("first " * 30), tokenizer.encode("second " * 10)
    proposer.propose({"a": a, "b": b}, 4)
    both = proposer.cached_tokens()
    assert both == len(a) + len(b) + 2 * 3
    proposer.forget("a")
    assert proposer.cached_tokens() == len(b) + 3
    proposer.forget("b")
    proposer.forget("never-seen")
    assert proposer.cached_tokens() == 0


def test_a_draft_of_another_tokenizer_is_refused_in_one_sentence(tmp_path) -> None:
    settings = _settings(tmp_path, MODEL="demo-small", DRAFT_MODEL="demo-tiny")
    from engine.model import resolve

    _, target_tok = mlx_load(str(resolve(settings)))
    with pytest.raises(ModelError) as refused:
        DraftProposer(settings, target_tok)
    message = str(refused.value)
    assert "DRAFT_MODEL=demo-tiny" in message and "MODEL=demo-small" in message
    assert "1024 tokens against 4096" in message and message.count(". ") == 0
    assert tokenizer_mismatch(target_tok, target_tok) is None


def test_a_draft_that_cannot_be_found_names_the_draft_setting(tmp_path) -> None:
    settings = _settings(tmp_path, MODEL="zoo-llama", DRAFT_MODEL="zoo-nonesuch")
    with pytest.raises(ModelError, match="^DRAFT_MODEL='zoo-nonesuch' is not a zoo model"):
        DraftProposer(settings, None)
    with pytest.raises(ConfigError, match="SPECULATIVE=draft needs DRAFT_MODEL"):  # said before any rank starts
        _settings(tmp_path, MODEL="zoo-llama")


@pytest.mark.parametrize(("name", "kind"), [("qwen3.5", "ArraysCache"), ("gpt-oss", "RotatingKVCache")])
def test_a_draft_whose_caches_cannot_roll_back_is_refused(name, kind, tmp_path) -> None:
    settings = _settings(tmp_path, MODEL="zoo-llama", DRAFT_MODEL="zoo-" + name)
    with pytest.raises(ModelError, match=f"^DRAFT_MODEL='zoo-{name}' keeps caches that cannot roll back .*{kind}"):
        DraftProposer(settings, None)


def test_a_broken_draft_folder_is_named(tmp_path) -> None:
    folder = tmp_path / "draft"
    folder.mkdir()
    (folder / "config.json").write_text("{not json")
    settings = _settings(tmp_path, MODEL="zoo-llama", DRAFT_MODEL=str(folder))
    with pytest.raises(ModelError, match=f"^DRAFT_MODEL='{folder}': .*config.json"):
        DraftProposer(settings, None)
