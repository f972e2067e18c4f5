"""SPECULATIVE picks rank 0's proposer; a proposer or a verification this build lacks is said in one sentence."""

from __future__ import annotations

import sys
from types import ModuleType, SimpleNamespace

import pytest

from engine.load_errors import ModelError
from engine.speculative.choose import cannot_verify, make_proposer
from engine.speculative.ngram import NgramProposer


def settings(mode: str) -> SimpleNamespace:
    return SimpleNamespace(SPECULATIVE=mode, NUM_DRAFT_TOKENS=4, DRAFT_MODEL="", MODEL="demo-tiny")


def test_off_and_ngram():
    assert make_proposer(settings("off"), None, None) is None
    assert isinstance(make_proposer(settings("ngram"), None, None), NgramProposer)


@pytest.mark.parametrize(("mode", "module"), [("draft", "engine.speculative.draft"), ("mtp", "engine.speculative.mtp")])
def test_a_proposer_missing_from_the_build_is_named(monkeypatch, mode, module):
    monkeypatch.setitem(sys.modules, module, None)  # what importing a module that is not there raises
    with pytest.raises(ModelError, match=f"SPECULATIVE={mode} is not available in this build.*set SPECULATIVE=ngram"):
        make_proposer(settings(mode), None, None)


@pytest.mark.parametrize(("mode", "module", "cls", "second"), [
    ("draft", "engine.speculative.draft", "DraftProposer", "tokenizer"),
    ("mtp", "engine.speculative.mtp", "MtpProposer", "loaded"),
])
def test_the_named_proposer_is_built_with_what_it_needs(monkeypatch, mode, module, cls, second):
    fake = ModuleType(module)
    setattr(fake, cls, lambda s, x: ("built", s.SPECULATIVE, x))
    monkeypatch.setitem(sys.modules, module, fake)
    assert make_proposer(settings(mode), "loaded", "tokenizer") == ("built", mode, second)


def test_the_proposers_refusal_passes_through(monkeypatch):
    fake = ModuleType("engine.speculative.mtp")

    def refuse(s, loaded):
        raise ModelError("SPECULATIVE=mtp: this model ships no multi-token-prediction heads")

    fake.MtpProposer = refuse
    monkeypatch.setitem(sys.modules, "engine.speculative.mtp", fake)
    with pytest.raises(ModelError, match="ships no multi-token-prediction heads"):
        make_proposer(settings("mtp"), None, None)


def test_without_the_verification_nothing_can_verify(monkeypatch):
    monkeypatch.setitem(sys.modules, "engine.speculative.rollback", None)
    assert "cannot verify drafts" in cannot_verify(object())


@pytest.mark.parametrize(("answer", "why"), [
    (True, None), (False, "its caches cannot roll back rejected drafts per sequence"),
    ((False, "RotatingKVCache keeps a window"), "RotatingKVCache keeps a window"), ((True, ""), None),
    ("", None), ("ArraysCache holds a state", "ArraysCache holds a state"),
])
def test_the_verifications_answer(monkeypatch, answer, why):
    fake = ModuleType("engine.speculative.rollback")
    fake.can_verify = lambda model: answer
    monkeypatch.setitem(sys.modules, "engine.speculative.rollback", fake)
    assert cannot_verify(object()) == why


def test_preflight_names_a_proposer_this_build_lacks(monkeypatch):
    from engine.speculative import preflight

    monkeypatch.setitem(sys.modules, "engine.speculative.mtp", None)  # as a build without the module imports it
    assert preflight._module("mtp") == ("SPECULATIVE=mtp is not available in this build (engine.speculative.mtp is "
                                        "missing); set SPECULATIVE=ngram or off")
