"""SPECULATIVE's settings and models judged before the engine starts: by the settings alone, and by the models'
tokenizers and heads in `launch.sh check` (and before `launch.sh start`), through the proposers' own modules."""

from __future__ import annotations

from pathlib import Path

from config import load_settings
from engine.speculative import preflight
from tests.harness import MODEL_CACHE
from tests.integration.test_launch_check import env, launch  # noqa: F401 (the fixture)

NO_ENV = Path("/nonexistent/.env")


def test_check_refuses_draft_without_a_draft_model(env):  # noqa: F811
    r = launch(env, "check", HOSTS="127.0.0.1", SPECULATIVE="draft")
    assert r.returncode == 2
    assert "SPECULATIVE=draft needs DRAFT_MODEL" in r.stderr


def test_check_names_a_draft_model_that_is_not_there(env):  # noqa: F811
    missing = Path(env["_root"]) / "no-draft"
    r = launch(env, "check", HOSTS="127.0.0.1", SPECULATIVE="draft", DRAFT_MODEL=str(missing))
    assert r.returncode == 1, r.stdout + r.stderr
    assert f"FAULT model: DRAFT_MODEL='{missing}': no config.json" in r.stdout


def test_check_warns_that_a_sliding_window_model_decodes_plainly_and_passes(env):  # noqa: F811
    # gpt-oss's sliding-window layers cannot roll back a draft: it serves, decoding plainly (a plain model's check
    # says nothing of it: test_launch_check.test_check_passes_on_local_hosts)
    r = launch(env, "check", HOSTS="127.0.0.1", SPECULATIVE="ngram", MODEL="zoo-gpt-oss")
    assert r.returncode == 0, r.stdout + r.stderr
    assert ("WARN model: SPECULATIVE=ngram: MODEL=zoo-gpt-oss decodes plainly, without speculation, since a "
            "sliding-window cache overwrites its oldest tokens and cannot drop rejected drafts; set SPECULATIVE=off"
            in r.stdout), r.stdout
    assert "preflight passed" in r.stdout


def settings(**kw):
    return load_settings({"MODEL": "demo-tiny", "MODEL_CACHE_DIR": str(MODEL_CACHE), **kw}, NO_ENV)


def test_a_draft_of_another_tokenizer_is_refused_and_one_of_the_same_passes(demo_tiny):
    # demo-small's vocabulary (4096) is not demo-tiny's (1024): the draft module's own comparison of both tokenizers
    code, text = preflight.verdict(settings(MODEL="demo-small", SPECULATIVE="draft", DRAFT_MODEL="demo-tiny"))
    assert code == preflight.VERDICT_REFUSED and "their tokenizers differ" in text and "1024 tokens against 4096" in text
    assert preflight.verdict(settings(SPECULATIVE="draft", DRAFT_MODEL="demo-tiny")) == (preflight.VERDICT_OK, "draft")


def test_a_linear_attention_hybrid_verifies_drafts_and_passes():
    # Qwen3-Next's linear-attention layers keep their state after each verified position: no warning, it speculates
    assert preflight.verdict(settings(MODEL="zoo-qwen3-next", SPECULATIVE="draft", DRAFT_MODEL="zoo-qwen3-next")) == (
        preflight.VERDICT_OK, "draft")


def test_mtp_is_refused_without_heads_and_passes_with_heads_tensor_or_pipeline(demo_tiny):
    code, text = preflight.verdict(settings(SPECULATIVE="mtp"))
    assert code == preflight.VERDICT_REFUSED and "no multi-token-prediction module here follows" in text
    assert preflight.verdict(settings(SPECULATIVE="mtp", MODEL="zoo-deepseek-v3-mtp")) == (preflight.VERDICT_OK, "mtp")
    # under pipeline the heads sit on the last stage, beside the final hidden state
    assert preflight.verdict(settings(SPECULATIVE="mtp", MODEL="zoo-deepseek-v3-mtp", PARALLEL="pipeline")) == (
        preflight.VERDICT_OK, "mtp")
