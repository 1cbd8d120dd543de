"""/openapi.json: the document's paths, body schemas generated from the protocol Structs,
the error schema, and that the path stays open when API keys are configured."""
from __future__ import annotations

import msgspec
import pytest
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.responses import JSONResponse
from starlette.routing import Route
from starlette.testclient import TestClient

from services.scheduler.auth import ApiKeyMiddleware
from services.scheduler.openapi import openapi_document
from services.scheduler.protocol import ApiError, ChatRequest, CompletionRequest

pytestmark = pytest.mark.unit


def test_document_lists_every_api_path():
    doc = openapi_document()
    assert doc["openapi"].startswith("3.1")
    assert set(doc["paths"]) == {"/v1/models", "/v1/completions", "/v1/chat/completions", "/health", "/v1/mesh",
                                 "/open_session", "/close_session"}
    for path in ("/v1/completions", "/v1/chat/completions"):
        op = doc["paths"][path]["post"]
        assert op["requestBody"]["content"]["application/json"]["schema"]["$ref"].startswith("#/components/schemas/")
        assert {"200", "400", "413"} <= set(op["responses"])


def test_body_schemas_are_the_protocol_structs():
    _, want = msgspec.json.schema_components((CompletionRequest, ChatRequest),
                                             ref_template="#/components/schemas/{name}")
    got = openapi_document()["components"]["schemas"]
    for name, schema in want.items():
        assert got[name] == schema
    assert set(got["CompletionRequest"]["required"]) == {"prompt"}
    assert set(got["ChatRequest"]["required"]) == {"messages"}


def test_error_schema_matches_api_error_bodies():
    schema = openapi_document()["components"]["schemas"]["Error"]
    body = ApiError(400, "bad", "prompt").body()
    assert set(schema["required"]) == set(body)
    assert set(schema["properties"]["error"]["required"]) == set(body["error"])


def test_openapi_json_is_open_when_keys_are_configured():
    async def doc(request):
        return JSONResponse(openapi_document())

    app = Starlette(routes=[Route("/openapi.json", doc), Route("/v1/models", doc)],
                    middleware=[Middleware(ApiKeyMiddleware, keys=("secret",))])
    with TestClient(app) as client:
        assert client.get("/openapi.json").status_code == 200
        assert client.get("/v1/models").status_code == 401
