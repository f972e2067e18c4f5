"""Anthropic's Messages API dialect: protocol, serving, render, streaming, routes."""
