"""The server's own OpenAPI 3.0 description, served at /openapi.json.

Limits in it are this server's and this model's (max_tokens, top_k, prompt size), so a client generator
or a fuzzer (schemathesis in tests/serving/test_fuzz.py) sees exactly what the server accepts.
"""

from __future__ import annotations

from typing import Any

from release.backends.jobs import ModelLimits
from release.core.server_settings import ServerSettings
from release.serving.metrics import Identity
from release.serving.protocol import INT32_MAX, MAX_STOP_CHARS

OPENAPI_VERSION = "3.0.3"


def openapi_schema(identity: Identity, settings: ServerSettings, limits: ModelLimits, model_name: str,
                   auth: bool) -> dict[str, Any]:
    """The OpenAPI document of one running server."""
    error = {"$ref": "#/components/schemas/Error"}
    errors = {str(code): {"description": why, "content": {"application/json": {"schema": error}}}
              for code, why in ((400, "invalid request: `param` names the field"), (401, "missing or wrong API key"),
                                (429, "queue full; see Retry-After"), (500, "server fault"),
                                (504, "request timeout"))}
    if not auth:
        del errors["401"]
    completion_ok = {"description": "a completion (JSON) or, with stream=true, server-sent events",
                     "content": {"application/json": {"schema": {"type": "object"}},
                                 "text/event-stream": {"schema": {"type": "string"}}}}
    doc: dict[str, Any] = {
        "openapi": OPENAPI_VERSION,
        "info": {"title": f"relctl serve {identity.model_id}", "version": identity.serving_config,
                 "description": "OpenAI-compatible text generation, served by relctl"},
        "paths": {
            "/v1/completions": {"post": _post("completions", "CompletionRequest", completion_ok, errors)},
            "/v1/chat/completions": {"post": _post("chatCompletions", "ChatRequest", completion_ok, errors)},
            "/v1/models": {"get": {"operationId": "listModels", "responses": {
                "200": {"description": "the served model", "content": {"application/json": {"schema": {
                    "type": "object", "required": ["object", "data"],
                    "properties": {"object": {"type": "string"}, "data": {"type": "array"}}}}}},
                **{k: v for k, v in errors.items() if k == "401"}}}},
            "/health": {"get": {"operationId": "health", "security": [], "responses": {
                "200": {"description": "loaded and listening", "content": {"application/json": {"schema": {
                    "type": "object", "required": ["status"], "properties": {"status": {"type": "string"}}}}}}}}},
        },
        "components": {"schemas": {**_request_schemas(settings, limits, model_name, identity), "Error": {
            "type": "object", "required": ["error"],
            "properties": {"error": {"type": "object", "required": ["message", "type", "code"], "properties": {
                "message": {"type": "string"}, "type": {"type": "string"},
                "param": {"type": "string", "nullable": True}, "code": {"type": "integer"}}}}}}},
    }
    if auth:
        doc["components"]["securitySchemes"] = {"bearer": {"type": "http", "scheme": "bearer"}}
        doc["security"] = [{"bearer": []}]
    return doc


def _post(operation: str, schema: str, ok: dict[str, Any], errors: dict[str, Any]) -> dict[str, Any]:
    return {"operationId": operation, "requestBody": {"required": True, "content": {"application/json": {
        "schema": {"$ref": f"#/components/schemas/{schema}"}}}}, "responses": {"200": ok, **errors}}


def _request_schemas(settings: ServerSettings, limits: ModelLimits, model_name: str,
                     identity: Identity) -> dict[str, Any]:
    text = {"type": "string", "maxLength": 32 * settings.max_prompt_tokens}
    sampling: dict[str, Any] = {
        "model": {"type": "string", "nullable": True, "enum": sorted({model_name, identity.model_id, identity.name})},
        "max_tokens": {"type": "integer", "nullable": True, "minimum": 1, "maximum": settings.max_output_tokens},
        "temperature": {"type": "number", "minimum": 0, "maximum": 2},
        "top_p": {"type": "number", "exclusiveMinimum": True, "minimum": 0, "maximum": 1},
        "top_k": {"type": "integer", "minimum": 0, "maximum": min(limits.vocab_size, INT32_MAX)},
        "seed": {"type": "integer", "nullable": True, "minimum": 0, "maximum": INT32_MAX},
        "n": {"type": "integer", "enum": [1]},
        "stream": {"type": "boolean"},
        "stream_options": {"type": "object", "nullable": True,
                           "properties": {"include_usage": {"type": "boolean"}}},
        "stop": {"nullable": True, "oneOf": [
            {"type": "string", "minLength": 1, "maxLength": MAX_STOP_CHARS},
            {"type": "array", "maxItems": 4, "items": {"type": "string", "minLength": 1, "maxLength": MAX_STOP_CHARS}},
        ]},
        "ignore_eos": {"type": "boolean", "description": "generate exactly max_tokens tokens (an extension "
                                                             "OpenAI-compatible engine servers share)"},
    }
    message = {"type": "object", "required": ["role", "content"], "properties": {
        "role": {"type": "string", "enum": ["system", "user", "assistant", "developer", "tool"]},
        "content": {"oneOf": [text, {"type": "array", "items": {
            "type": "object", "required": ["type", "text"],
            "properties": {"type": {"type": "string", "enum": ["text"]}, "text": text}}}]}}}
    return {
        "CompletionRequest": {"type": "object", "required": ["prompt"], "properties": {
            "prompt": {"oneOf": [text, {"type": "array", "minItems": 1, "maxItems": 1, "items": text}]},
            **sampling}},
        "ChatRequest": {"type": "object", "required": ["messages"], "properties": {
            "messages": {"type": "array", "minItems": 1, "items": message},
            "max_completion_tokens": sampling["max_tokens"], **sampling}},
    }
