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
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from django.conf import settings

from shunter.gateway.auth import KeyGrant
from shunter.gateway.db import DATABASE_DOWN, submit_db
from shunter.gateway.spool import PendingRecord, RecordSpool, SpoolReplayer
from shunter.gateway.ttl_cache import TtlCache

log = logging.getLogger("shunter.gateway")

# As long as the key cache: a deleted row is noticed as soon as a revoked key is.
ROW_CACHE_S = 3.0
# The rows records point at (tenant, key, deployment), by kind and id: every record of a
# busy key would otherwise read the same three rows again.
rows: TtlCache[tuple[str, int], Any] = TtlCache(ttl_s=ROW_CACHE_S)


def _row(kind: str, pk: int, load: Callable[[], Any]) -> Any:
    """The row ``kind``/``pk`` as ``load`` reads it, kept ``ROW_CACHE_S`` seconds."""
    return rows.get_blocking((kind, pk), load)


def write_record(record: PendingRecord) -> None:
    """Write one RequestRecord (database threads), once per key; rows deleted meanwhile
    stay null."""
    from shunter.platform.models import Deployment
    from shunter.tenants.models import ApiKey, Tenant
    from shunter.tenants.services import request_record_create

    tenant = _row(
        "tenant",
        record.tenant_id,
        lambda: (
            Tenant.objects.select_related("default_slo_class").filter(pk=record.tenant_id).first()
        ),
    )
    if tenant is None:
        return
    api_key = _row("key", record.api_key_id, ApiKey.objects.filter(pk=record.api_key_id).first)
    deployment = _row(
        "deployment",
        record.deployment_id,
        Deployment.objects.select_related("slo_class").filter(pk=record.deployment_id).first,
    )
    request_record_create(
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
    """Write ``batch`` in one transaction, a savepoint each (a record that fails loses
    no other); each record's error, or None. A batch that does not commit fails every
    record with ``NotCommitted``."""
    from django.db import IntegrityError, transaction

    errors: list[BaseException | None] = []
    try:
        with transaction.atomic():
            for record in batch:
                try:
                    with transaction.atomic():
                        write_record(record)
                    errors.append(None)
                except IntegrityError as e:
                    # Its key was written by another writer meanwhile: not twice.
                    errors.append(None if _key_taken(record) else e)
                except Exception as e:
                    errors.append(e)
    except Exception as e:
        # A deferred constraint fails at the commit (a row deleted after it was cached):
        # read the rows again before the next try.
        rows.forget()
        lost = NotCommitted(f"the batch of {len(batch)} records did not commit: {e!r}")
        lost.__cause__ = e
        errors = [lost] * len(batch)
    return errors


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


class RecordWriter:
    """Writes RequestRecords in batches on the gateway's database threads: one job at a
    time takes every record waiting, in one transaction (a savepoint each, so that a
    record that fails loses no other); the records that end meanwhile wait for the next.
    A request's record costs one commit per batch instead of one each, and one thread
    hop.

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
