"""API key secrets: how they are made and the only form in which they are stored."""

from __future__ import annotations

import hashlib
import secrets

from shunter.tenants.models import KEY_DISPLAY_CHARS, KEY_PREFIX

SECRET_BYTES = 32  # 43 URL-safe characters


def new_secret() -> str:
    """A fresh secret: ``sk-shunter-`` and 43 URL-safe characters (256 random bits)."""
    return KEY_PREFIX + secrets.token_urlsafe(SECRET_BYTES)


def secret_digest(secret: str) -> str:
    """The SHA-256 hex digest of the whole secret: what the database stores and looks up."""
    return hashlib.sha256(secret.encode()).hexdigest()


def secret_prefix(secret: str) -> str:
    """The first characters of the secret, shown in lists to tell keys apart."""
    return secret[:KEY_DISPLAY_CHARS]


def looks_like_secret(value: str) -> bool:
    """Whether ``value`` has the shape of a key secret (cheap check before any lookup)."""
    return (
        value.startswith(KEY_PREFIX)
        and len(value) == len(KEY_PREFIX) + 43
        and all(c.isalnum() or c in "-_" for c in value[len(KEY_PREFIX) :])
    )
