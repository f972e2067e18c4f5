"""Assertions the API unit tests share."""

from __future__ import annotations


def assert_error(r, status: int, *, param: str | None = None, code: str | None = None, type_: str | None = None):
    """r is an OpenAI error object with this status (and param, code, type when given); returns it."""
    assert r.status_code == status, r.text
    assert r.headers["content-type"] == "application/json"
    error = r.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["message"]
    assert error["param"] == param
    if code is not None:
        assert error["code"] == code
    if type_ is not None:
        assert error["type"] == type_
    return error
