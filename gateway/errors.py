"""The gateway's refusals, as OpenAI error bodies (``ApiError``, shared with the engine)."""

from __future__ import annotations

from shunter.engine.api.errors import ApiError, bad_request

__all__ = ["ApiError", "bad_request", "engine_unavailable", "model_not_found"]


def model_not_found(model: str) -> ApiError:
    return ApiError(
        404, f"The model {model!r} does not exist.", param="model", code="model_not_found"
    )


def engine_unavailable(message: str, *, status: int = 503) -> ApiError:
    """The engine cannot answer: unreachable or broken (503), or silent too long (504)."""
    return ApiError(status, message, type="service_unavailable", code="engine_unavailable")
