"""OpenAI's Responses API dialect (POST /v1/responses): protocol, serving, render, streaming, routes."""
