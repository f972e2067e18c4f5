"""The OpenAI dialect: its request/response schemas (protocol), their translation to engine messages
(serving), response rendering (render) and its /v1 endpoints (routes)."""
