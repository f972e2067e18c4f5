"""The API fuzzed against its own OpenAPI document (/openapi.json) with schemathesis: no 5xx, no
status, content type, header or body outside the document. A real engine answers, so generated
requests that pass validation really generate (MAX_TOKENS_LIMIT is lowered to keep that quick)."""

from __future__ import annotations

import httpx
import pytest
import schemathesis
from hypothesis import HealthCheck, settings
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    negative_data_rejection,
    response_headers_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from api.openapi import openapi_document
from config import load_settings
from tests.harness import Stack

CHECKS = [
    not_a_server_error,
    status_code_conformance,
    content_type_conformance,
    response_headers_conformance,
    response_schema_conformance,
    negative_data_rejection,
]
EXAMPLES = 40  # per operation (23 of them, each with the real engine behind): CI-sized
# MODEL as the test stack pins it: the document names the served model (examples, enums)
FUZZED_SETTINGS = {"MODEL": "demo-tiny", "MAX_TOKENS_LIMIT": "16", "MAX_TOKENS_DEFAULT": "8"}

# The document is built at collection time, with no server up; the one the running API serves
# must be the same (checked below), so this is what schemathesis tests.
DOCUMENT = openapi_document(load_settings(FUZZED_SETTINGS, "/nonexistent/.env"))
schema = schemathesis.openapi.from_dict(DOCUMENT)


@pytest.fixture(scope="module")
def fuzzed_api(stack):
    s = Stack(root=stack.root, extra=FUZZED_SETTINGS)
    api = s.start_api()
    yield s.base_url
    api.stop()


def test_the_api_serves_this_document(fuzzed_api):
    assert httpx.get(fuzzed_api + "/openapi.json", timeout=10).json() == DOCUMENT


@schema.parametrize()
@settings(max_examples=EXAMPLES, deadline=None, database=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much,
                                 HealthCheck.function_scoped_fixture])
def test_the_api_keeps_to_its_openapi_document(case, fuzzed_api):
    case.call_and_validate(base_url=fuzzed_api, checks=CHECKS, timeout=60)
