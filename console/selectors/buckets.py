"""How the console's selectors cut time: minute buckets (the rollups' grain), buckets of
a few seconds computed in SQL, and how far before a window the arrival index is searched
for requests that ended in it."""

from __future__ import annotations

from datetime import datetime
from typing import TYPE_CHECKING, Any

from django.db.models import BigIntegerField, Func

if TYPE_CHECKING:
    from django.db.backends.base.base import BaseDatabaseWrapper
    from django.db.models.sql.compiler import SQLCompiler, _AsSqlType

# Request records are filtered by end time within the arrival index: requests longer than
# this are left out of the rates.
LONGEST_REQUEST_S = 600


def floor_minute(t: datetime) -> datetime:
    return t.replace(second=0, microsecond=0)


class EpochBucket(Func):
    """The start of the ``seconds``-long bucket holding a datetime, in Unix seconds
    (PostgreSQL and SQLite: the two databases the settings accept)."""

    output_field = BigIntegerField()

    def __init__(self, expression: Any, seconds: int):
        super().__init__(expression)
        self.seconds = int(seconds)

    def as_postgresql(
        self, compiler: SQLCompiler, connection: BaseDatabaseWrapper, **extra: Any
    ) -> _AsSqlType:
        template = "(FLOOR(EXTRACT(EPOCH FROM %(expressions)s) / %(n)s) * %(n)s)::bigint"
        return self.as_sql(compiler, connection, template=template, n=self.seconds, **extra)

    def as_sqlite(
        self, compiler: SQLCompiler, connection: BaseDatabaseWrapper, **extra: Any
    ) -> _AsSqlType:
        template = "((CAST(strftime('%%%%s', %(expressions)s) AS INTEGER) / %(n)s) * %(n)s)"
        return self.as_sql(compiler, connection, template=template, n=self.seconds, **extra)
