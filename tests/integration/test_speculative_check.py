"""SPECULATIVE's settings and models judged before the engine starts: by the settings alone, and by the models'
tokenizers and heads in `launch.sh check` (and before `launch.sh start`)."""

from __future__ import annotations

import sys
from pathlib import Path
from types import ModuleType

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


def test_check_passes_with_ngram(env):  # noqa: F811
    r = launch(env, "check", HOSTS="127.0.0.1", SPECULATIVE="ngram")
    assert r.returncode == 0, r.stdout + r.stderr


def settings(**kw):
    return load_settings({"MODEL": "demo-tiny", "MODEL_CACHE_DIR": str(MODEL_CACHE), **kw}, NO_ENV)


def test_the_draft_proposers_tokenizer_answer_is_the_verdict(demo_tiny, monkeypatch):
    seen = {}

    def mismatch(draft_tok, target_tok, draft_name, target_name):
        seen["vocab"] = (len(draft_tok.vocab), len(target_tok.vocab))
        return f"DRAFT_MODEL={draft_name} cannot propose tokens for MODEL={target_name}: their tokenizers differ"

    fake = ModuleType("engine.speculative.draft")
    fake.tokenizer_mismatch = mismatch
    monkeypatch.setitem(sys.modules, "engine.speculative.draft", fake)
    code, text = preflight.verdict(settings(SPECULATIVE="draft", DRAFT_MODEL="demo-tiny"))
    assert code == preflight.VERDICT_REFUSED and "their tokenizers differ" in text
    assert seen["vocab"][0] == seen["vocab"][1] > 0  # both tokenizers were read
    fake.tokenizer_mismatch = lambda *a: None
    assert preflight.verdict(settings(SPECULATIVE="draft", DRAFT_MODEL="demo-tiny"))[0] == preflight.VERDICT_OK


def test_mtp_asks_the_mtp_proposers_answer(demo_tiny, monkeypatch):
    fake = ModuleType("engine.speculative.mtp")
    fake.mtp_refusal = lambda folder: f"SPECULATIVE=mtp: {folder.name} has no multi-token-prediction heads"
    monkeypatch.setitem(sys.modules, "engine.speculative.mtp", fake)
    code, text = preflight.verdict(settings(SPECULATIVE="mtp"))
    assert code == preflight.VERDICT_REFUSED and "has no multi-token-prediction heads" in text
    monkeypatch.setitem(sys.modules, "engine.speculative.mtp", None)
    code, text = preflight.verdict(settings(SPECULATIVE="mtp"))
    assert code == preflight.VERDICT_REFUSED and "SPECULATIVE=mtp is not available in this build" in text
