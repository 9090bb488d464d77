"""The usage records' writer: each request's RequestRecord, written off the request's
path in batches on the gateway's database threads.

Records are written in batches (``RecordWriter``): those that end while one batch is
being written go together in the next, one transaction on one database thread; records
of a batch that did not commit (the database unreachable, the commit refused) are
spooled to local disk and replayed when it answers again (``spool``).
"""

from __future__ import annotations

import concurrent.futures
import functools
import logging
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from django.conf import settings

from shunter.gateway.auth import KeyGrant
from shunter.gateway.db import DATABASE_DOWN, submit_db
from shunter.gateway.spool import PendingRecord, RecordSpool, SpoolReplayer
from shunter.gateway.ttl_cache import TtlCache

if TYPE_CHECKING:
    from shunter.tenants.models import RequestRecord

log = logging.getLogger("shunter.gateway")

# How long a batch of records waits for the requests on their way to their first token
# (``starting``): their TTFT is the gateway's critical path, and a batch's writing holds
# the interpreter for a millisecond or more, on hosts with a core or two. A second is
# invisible in rollups kept per minute; under a steady stream of arrivals, batches
# are written once a second.
RECORD_DEFER_S = 1.0

# As long as the key cache: a deleted row is noticed as soon as a revoked key is.
ROW_CACHE_S = 3.0
# The rows records point at (tenant, key, deployment), by kind and id: every record of a
# busy key would otherwise read the same three rows again.
rows: TtlCache[tuple[str, int], Any] = TtlCache(ttl_s=ROW_CACHE_S)


def _row(kind: str, pk: int, load: Callable[[], Any]) -> Any:
    """The row ``kind``/``pk`` as ``load`` reads it, kept ``ROW_CACHE_S`` seconds."""
    return rows.get_blocking((kind, pk), load)


def built_record(record: PendingRecord) -> RequestRecord | None:
    """The RequestRecord to write for ``record`` (database threads); None when its tenant
    was deleted meanwhile. Other rows deleted meanwhile stay null."""
    from shunter.platform.models import Deployment
    from shunter.tenants.models import ApiKey, Tenant
    from shunter.tenants.services import request_record_build

    tenant = _row(
        "tenant",
        record.tenant_id,
        lambda: (
            Tenant.objects.select_related("default_slo_class").filter(pk=record.tenant_id).first()
        ),
    )
    if tenant is None:
        return None
    api_key = _row("key", record.api_key_id, ApiKey.objects.filter(pk=record.api_key_id).first)
    deployment = _row(
        "deployment",
        record.deployment_id,
        Deployment.objects.select_related("slo_class").filter(pk=record.deployment_id).first,
    )
    return request_record_build(
        tenant=tenant,
        api_key=api_key,
        deployment=deployment,
        record_key=record.record_key,
        **record.fields,
    )


class NotCommitted(Exception):
    """A batch of records did not commit (the database unreachable, the commit refused):
    none of its records was written, and each may be written again later."""


def write_records(batch: list[PendingRecord]) -> list[BaseException | None]:
    """Write ``batch`` in one transaction; each record's error, or None. A batch that
    does not commit fails every record with ``NotCommitted``.

    The records go in one insert, their rollups in one update per row
    (``request_records_create``), in a savepoint. If a record fails that (its key
    written already, its data refused), each is written again in a savepoint of its
    own, so that a record that fails loses no other."""
    from django.db import transaction

    try:
        with transaction.atomic():
            errors = _write_together(batch) if len(batch) > 1 else None
            if errors is None:
                errors = [_write_alone(record) for record in batch]
    except Exception as e:
        # A deferred constraint fails at the commit (a row deleted after it was cached):
        # read the rows again before the next try.
        rows.forget()
        lost = NotCommitted(f"the batch of {len(batch)} records did not commit: {e!r}")
        lost.__cause__ = e
        errors = [lost] * len(batch)
    return errors


def _write_together(batch: list[PendingRecord]) -> list[BaseException | None] | None:
    """Every record of ``batch`` in one insert (``request_records_create``'s savepoint):
    each one's None, or None when any failed it. An unreachable database fails the
    batch."""
    from shunter.tenants.services import request_records_create

    try:
        built = []
        for record in batch:
            if (row := built_record(record)) is not None:
                built.append(row)
            # Let the event loop in between records: building one holds the interpreter
            # with no database wait, so a batch built at once could hold the streams'
            # relays back for up to a switch interval (5 ms) at a time.
            time.sleep(0)
        request_records_create(built)
    except DATABASE_DOWN:
        raise
    except Exception:
        return None
    return [None] * len(batch)


def _write_alone(record: PendingRecord) -> BaseException | None:
    """Write one record in a savepoint of its own; its error, or None. A record whose
    key another writer wrote meanwhile is written: not twice."""
    from django.db import IntegrityError

    from shunter.tenants.services import request_records_create

    try:
        built = built_record(record)
        if built is not None:
            request_records_create([built])
    except IntegrityError as e:
        return None if _key_taken(record) else e
    except DATABASE_DOWN:
        raise
    except Exception as e:
        return e
    return None


def _key_taken(record: PendingRecord) -> bool:
    from shunter.tenants.models import RequestRecord

    return RequestRecord.objects.filter(record_key=record.record_key).exists()


def replay_records(batch: list[PendingRecord]) -> None:
    """Write spooled records (``RecordSpool.replay``'s writer): raises when the database
    is down or the batch did not commit, so that they stay spooled; a record the
    database refuses for itself (its data) would be refused on every try, and is
    dropped with a log line."""
    for record, error in zip(batch, write_records(batch), strict=True):
        if _is_lost(error):
            assert error is not None
            raise error
        if error is not None:
            log.error("spooled record %s refused, dropped: %r", record.record_key, error)


class Starting:
    """Requests on their way to their first byte of output (the gateway's critical
    path), counted on the event loop and waited for on the database threads: the
    records' writer waits until none is (``wait_idle``)."""

    def __init__(self) -> None:
        self._count = 0
        self._idle = threading.Condition()

    def __enter__(self) -> None:
        with self._idle:
            self._count += 1

    def __exit__(self, *_: object) -> None:
        with self._idle:
            self._count -= 1
            if not self._count:
                self._idle.notify_all()

    @property
    def count(self) -> int:
        return self._count

    def wait_idle(self, timeout_s: float) -> bool:
        """Block until no request is starting, at most ``timeout_s``; whether none is."""
        with self._idle:
            return self._idle.wait_for(lambda: not self._count, timeout_s)


starting = Starting()


class RecordWriter:
    """Writes RequestRecords in batches on the gateway's database threads: one job at a
    time takes every record waiting, in one transaction (``write_records``: one insert,
    or a savepoint each when a record fails that); the records that end meanwhile wait
    for the next. A request's record costs one commit per batch instead of one each,
    and one thread hop. A batch waits while requests are starting (``starting``), for at
    most ``RECORD_DEFER_S``, so that its writing does not delay their first tokens.

    Each record gets its idempotency key when it is queued. Records of a batch that did
    not commit, or that the database could not take (unreachable), go to the spool
    (``GATEWAY_SPOOL_DIR``, see ``spool``) and are replayed in the background when the
    database answers again; ``start`` replays what an earlier process left there."""

    def __init__(self, spool_dir: Path | None = None) -> None:
        self._lock = threading.Lock()
        self._waiting: list[tuple[PendingRecord, concurrent.futures.Future[None]]] = []
        self._writing = False
        self._spool_dir = spool_dir

    @functools.cached_property
    def replayer(self) -> SpoolReplayer:
        """The spool and its replays (settings are read on first use, not at import)."""
        spool = RecordSpool(self._spool_dir or Path(settings.GATEWAY_SPOOL_DIR))
        return SpoolReplayer(spool, replay_records, submit_db)

    def start(self) -> None:
        """Replay the records an earlier process spooled (at the gateway's start)."""
        if self.replayer.spool.pending():
            self.replayer.soon(0)

    def add(
        self, grant: KeyGrant, deployment_id: int, fields: dict[str, Any]
    ) -> concurrent.futures.Future[None]:
        """Queue one record (``request_record_create``'s arguments in ``fields``); the
        future ends when it is committed or spooled, or with the error that lost it."""
        record = PendingRecord(
            record_key=uuid.uuid4(),
            tenant_id=grant.tenant_id,
            api_key_id=grant.api_key_id,
            deployment_id=deployment_id,
            fields=fields,
        )
        written: concurrent.futures.Future[None] = concurrent.futures.Future()
        with self._lock:
            self._waiting.append((record, written))
            start, self._writing = not self._writing, True
        if start:
            submit_db(self._write).add_done_callback(self._job_ended)
        return written

    def _job_ended(self, job: concurrent.futures.Future[None]) -> None:
        """A job that failed before it could write (no database connection) settles the
        records waiting, and the next record starts a new one."""
        error = job.exception()
        if error is None:
            return
        with self._lock:
            batch, self._waiting = self._waiting, []
            self._writing = False
        self._settle(batch, [error] * len(batch))

    def _write(self) -> None:
        while True:
            starting.wait_idle(RECORD_DEFER_S)
            with self._lock:
                batch, self._waiting = self._waiting, []
                if not batch:
                    self._writing = False
                    return
            self._settle(batch, write_records([record for record, _ in batch]))

    def _settle(
        self,
        batch: list[tuple[PendingRecord, concurrent.futures.Future[None]]],
        errors: list[BaseException | None],
    ) -> None:
        """End each record's future: written, spooled (the database was unreachable or
        the batch did not commit), or failed with its error."""
        lost = [(record, e) for (record, _), e in zip(batch, errors, strict=True) if _is_lost(e)]
        if lost:
            try:
                self.replayer.spool.append([record for record, _ in lost])
            except OSError as e:
                log.error("could not spool %d records: %r", len(lost), e)
                errors = [e if _is_lost(error) else error for error in errors]
            else:
                log.warning("%d records not written, spooled: %r", len(lost), lost[0][1])
                errors = [None if _is_lost(error) else error for error in errors]
                self.replayer.soon()
        for (_, written), error in zip(batch, errors, strict=True):
            if error is None:
                written.set_result(None)
            else:
                written.set_exception(error)


def _is_lost(error: BaseException | None) -> bool:
    """Whether ``error`` lost a record that a later write may keep (spool it)."""
    return isinstance(error, (*DATABASE_DOWN, NotCommitted))


records = RecordWriter()
