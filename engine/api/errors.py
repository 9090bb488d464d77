"""Errors in OpenAI's format: ``{"error": {"message", "type", "param", "code"}}``."""

from __future__ import annotations

from typing import Any

INVALID_REQUEST = "invalid_request_error"


class ApiError(Exception):
    """A request the server refuses; ``status`` is the HTTP status of the reply."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        type: str = INVALID_REQUEST,
        param: str | None = None,
        code: str | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.type = type
        self.param = param
        self.code = code

    def body(self) -> dict[str, Any]:
        return {
            "error": {
                "message": self.message,
                "type": self.type,
                "param": self.param,
                "code": self.code,
            }
        }


def bad_request(message: str, param: str | None = None) -> ApiError:
    return ApiError(400, message, param=param)


def model_not_found(model: str) -> ApiError:
    return ApiError(
        404,
        f"The model {model!r} does not exist on this engine.",
        param="model",
        code="model_not_found",
    )


def unavailable(message: str) -> ApiError:
    return ApiError(503, message, type="service_unavailable", code="service_unavailable")
