"""Limit/offset pagination that no query string can turn into a database error."""

from __future__ import annotations

from rest_framework.pagination import LimitOffsetPagination


class BoundedLimitOffsetPagination(LimitOffsetPagination):
    """``?limit=`` at most ``max_limit``: an unbounded limit reaches PostgreSQL's LIMIT,
    which refuses values beyond a bigint (a 500). An ``?offset=`` past the rows needs no
    bound: the base class answers it with an empty page before any query."""

    max_limit = 1000
