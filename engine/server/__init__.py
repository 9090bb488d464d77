"""The engine's HTTP server: OpenAI-compatible API, control API and Prometheus metrics."""
