"""The OpenAI-compatible HTTP gateway: Starlette in front of engine rank 0's Unix socket. No MLX here."""

from api.app import create_app

__all__ = ["create_app"]
