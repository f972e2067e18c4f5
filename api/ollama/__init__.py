"""Ollama's /api dialect: protocol, serving, render, models, routes."""
