"""Step 8 (issue 12 item 10): the service serves its OpenAPI schema, and a property-based HTTP fuzzer
(schemathesis strategies driven by hypothesis) sends requests generated from that schema to the real
server on 127.0.0.1: no input, schema-valid or not, may get a 5xx or an answer the schema does not
document; schema-invalid input is rejected with a 4xx; unauthenticated requests to protected routes
always get 401.

(schemathesis' own pytest loader does not run under pytest 9 — it reads ``request.node._nodeid`` — so
the tests use its documented Python API, ``schema.as_strategy``, with ``hypothesis.given``.)
"""

from __future__ import annotations

from collections import Counter

import httpx
import pytest
from hypothesis import HealthCheck, given, settings

schemathesis = pytest.importorskip("schemathesis")

TOKEN = "test-token-123456"  # the conftest's server token
AUTH = {"Authorization": f"Bearer {TOKEN}"}
PROTECTED = {("POST", "/v1/score"), ("GET", "/metrics")}
FUZZ = settings(max_examples=25, deadline=None, derandomize=True, database=None,
                suppress_health_check=list(HealthCheck))


def load_schema(url: str, *, credentials: bool = True):
    config = schemathesis.Config.from_dict({
        "generation": {"with-security-parameters": credentials},
        # refusals JSON Schema cannot state: duplicate item keys (422) and the byte cap on the body (413), which
        # the service checks before it parses anything (the fuzzer's nested trajectories easily exceed 64 KiB)
        "checks": {"positive_data_acceptance": {"expected-statuses": [200, 413, 422]},
                   "negative_data_rejection": {"expected-statuses": [400, 401, 404, 413, 422, 429]}},
    })
    return schemathesis.openapi.from_url(f"{url}/openapi.json", config=config)


def client_timeout_s(url: str) -> float:
    """The fuzzer's read timeout, from the bound the server states in its schema, with a wide margin:
    the server's own deadline, not the client's patience, decides how a slow item ends (issue 26)."""
    bound = httpx.get(f"{url}/openapi.json", timeout=10).json()["paths"]["/v1/score"]["post"]["x-answer-within-s"]
    return 3 * (bound["item_timeout_s"] + bound["margin_s"]) + 20


def test_openapi_schema_is_served_and_describes_the_protections(shared_server):
    doc = httpx.get(f"{shared_server.url}/openapi.json", timeout=10).json()
    assert doc["openapi"].startswith("3.")
    score = doc["paths"]["/v1/score"]["post"]
    assert score["security"] == [{"bearerAuth": []}] and doc["paths"]["/metrics"]["get"]["security"]
    assert {"200", "401", "404", "413", "422", "429"} <= set(score["responses"])
    body = doc["components"]["schemas"]["ScoreRequest"]
    assert body["properties"]["items"]["maxItems"] == 50  # the server's max_items
    assert "slow" in body["properties"]["reward"]["enum"]  # the registered rewards
    assert score["x-answer-within-s"] == {"item_timeout_s": 2.0, "margin_s": 1.0}  # the stated bound (issue 26)
    assert "min(timeout_s, item_timeout_s) + 1 s" in score["description"]
    assert "capped at the server's item_timeout_s (2 s)" in body["properties"]["timeout_s"]["description"]


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["positive", "negative"])
def test_service_conforms_to_its_schema_and_never_answers_5xx(shared_server, mode):
    """Authenticated requests generated from the schema (valid ones, then invalid ones): every answer is
    documented and matches its schema, never a 5xx; invalid input is rejected with a 4xx."""
    schema = load_schema(shared_server.url)
    seen: Counter[tuple[str, int]] = Counter()
    read_timeout = client_timeout_s(shared_server.url)

    @FUZZ
    @given(case=schema.as_strategy(schemathesis.GenerationMode(mode), headers=AUTH))
    def fuzz(case):
        response = case.call_and_validate(timeout=read_timeout)
        seen[(case.path, response.status_code)] += 1

    fuzz()
    assert all(status < 500 for _, status in seen)
    if mode == "positive":
        assert seen[("/v1/score", 200)] > 0  # the fuzzer really got past auth and validation
    else:
        assert any(path == "/v1/score" and status in (413, 422) for path, status in seen)


@pytest.mark.slow
def test_unauthenticated_requests_are_always_rejected(shared_server):
    schema = load_schema(shared_server.url, credentials=False)
    seen: Counter[tuple[str, int]] = Counter()
    read_timeout = client_timeout_s(shared_server.url)

    @FUZZ
    @given(case=schema.as_strategy(schemathesis.GenerationMode.POSITIVE))
    def fuzz(case):
        response = case.call(timeout=read_timeout)
        seen[(case.path, response.status_code)] += 1
        assert response.status_code < 500
        if (case.method.upper(), case.path) in PROTECTED:
            assert response.status_code == 401, (case.path, response.status_code, response.text[:200])
            assert response.json()["error"]["code"] == "unauthorized"

    fuzz()
    assert seen[("/v1/score", 401)] > 0
