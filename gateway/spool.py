"""The gateway's spool: usage records kept on local disk while the database is down.

When a batch of RequestRecords cannot be written because the database is unreachable or
the batch's commit failed, its records are appended to a local file, one JSON line each,
and fsync'd before the request's accounting counts them as kept. They are written to the
database when it answers again (``SpoolReplayer``: a retry with backoff after the failed
write, and one at the gateway's start), exactly once: every record carries its idempotency key
(``RequestRecord.record_key``) and a record whose key the database holds already is
skipped, so a crash between the database's commit and the spool's removal bills nothing
twice.

Several gateway processes may share one spool directory (the ``GATEWAY_SPOOL_DIR``
setting, ``<var>/spool`` by default). ``records.jsonl`` takes the appends, each under an
exclusive ``flock`` of the file. A replay takes ``replay.lock`` (one replayer at a time
across processes), moves ``records.jsonl`` to ``replaying.jsonl`` under the append lock
(an appender that opened the file before the move notices, and opens the new one),
writes its records and then removes it; a ``replaying.jsonl`` left by a replayer that
died is replayed first.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import fcntl
import json
import logging
import os
import threading
import uuid
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

log = logging.getLogger("shunter.gateway.spool")

# request_record_create's arguments that are datetimes (ISO 8601 strings in the file).
DATETIME_FIELDS = ("t_arrival", "t_first_token", "t_end")
REPLAY_BATCH = 500


@dataclass(frozen=True)
class PendingRecord:
    """One RequestRecord to write: its idempotency key, its tenant, API key and
    deployment by id (rows deleted meanwhile stay null), and ``request_record_create``'s
    other arguments."""

    record_key: uuid.UUID
    tenant_id: int
    api_key_id: int
    deployment_id: int
    fields: dict[str, Any]

    def to_line(self) -> bytes:
        fields = {
            name: value.isoformat() if isinstance(value, datetime) else value
            for name, value in self.fields.items()
        }
        line = {
            "record_key": str(self.record_key),
            "tenant_id": self.tenant_id,
            "api_key_id": self.api_key_id,
            "deployment_id": self.deployment_id,
            "fields": fields,
        }
        return json.dumps(line, separators=(",", ":")).encode() + b"\n"

    @classmethod
    def from_line(cls, line: bytes) -> PendingRecord:
        """The record of one line (ValueError, KeyError or TypeError for a torn one)."""
        data = json.loads(line)
        fields = dict(data["fields"])
        for name in DATETIME_FIELDS:
            if fields.get(name) is not None:
                fields[name] = datetime.fromisoformat(fields[name])
        return cls(
            record_key=uuid.UUID(data["record_key"]),
            tenant_id=int(data["tenant_id"]),
            api_key_id=int(data["api_key_id"]),
            deployment_id=int(data["deployment_id"]),
            fields=fields,
        )


def _fsync_dir(directory: Path) -> None:
    """Make a file's creation, rename or removal in ``directory`` durable."""
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class RecordSpool:
    """The spool directory (see the module docstring): ``append`` is durable when it
    returns; ``replay`` hands the spooled records to a writer and forgets them once
    written."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.path = directory / "records.jsonl"
        self.replaying_path = directory / "replaying.jsonl"
        self.lock_path = directory / "replay.lock"

    def pending(self) -> bool:
        """Whether records wait in the spool."""
        return any(p.exists() and p.stat().st_size > 0 for p in (self.path, self.replaying_path))

    def append(self, records: Sequence[PendingRecord]) -> None:
        """Append ``records`` and fsync them (OSError when the disk refuses)."""
        data = b"".join(record.to_line() for record in records)
        self.directory.mkdir(parents=True, exist_ok=True)
        while True:
            fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX)
                if self._is_current(fd):
                    view = memoryview(data)
                    while view:
                        view = view[os.write(fd, view) :]
                    os.fsync(fd)
                    _fsync_dir(self.directory)
                    return
            finally:
                os.close(fd)  # and the lock with it
            # A replay moved the file away between our open and our lock: open the new one.

    def _is_current(self, fd: int) -> bool:
        try:
            return os.fstat(fd).st_ino == os.stat(self.path).st_ino
        except FileNotFoundError:
            return False

    def replay(self, write: Callable[[list[PendingRecord]], None]) -> int | None:
        """Hand the spooled records to ``write`` in batches of ``REPLAY_BATCH`` and forget
        them once every batch is written; the number replayed, or None when another
        process is replaying now. ``write`` skips records whose key the database holds
        already and raises when the database fails (the records stay spooled)."""
        self.directory.mkdir(parents=True, exist_ok=True)
        with self._replay_lock() as locked:
            if not locked:
                return None
            replayed = 0
            # A move left by a replayer that died first, then what was appended since.
            for _ in range(2):
                if not self.replaying_path.exists() and not self._claim():
                    break
                replayed += self._replay_claimed(write)
            return replayed

    @contextlib.contextmanager
    def _replay_lock(self) -> Iterator[bool]:
        fd = os.open(self.lock_path, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                yield False
                return
            yield True
        finally:
            os.close(fd)

    def _claim(self) -> bool:
        """Move ``records.jsonl`` to ``replaying.jsonl`` (under the append lock)."""
        try:
            fd = os.open(self.path, os.O_RDONLY)
        except FileNotFoundError:
            return False
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            os.rename(self.path, self.replaying_path)
            _fsync_dir(self.directory)
        finally:
            os.close(fd)
        return True

    def _replay_claimed(self, write: Callable[[list[PendingRecord]], None]) -> int:
        records: list[PendingRecord] = []
        with self.replaying_path.open("rb") as handle:
            for number, line in enumerate(handle, 1):
                try:
                    records.append(PendingRecord.from_line(line))
                except (ValueError, KeyError, TypeError):
                    # Only a write cut short by a crash leaves such a line; it was never
                    # counted as kept.
                    log.warning("spool line %d is torn; skipped", number)
        for start in range(0, len(records), REPLAY_BATCH):
            write(records[start : start + REPLAY_BATCH])
        self.replaying_path.unlink()
        _fsync_dir(self.directory)
        if records:
            log.info("replayed %d spooled records into the database", len(records))
        return len(records)


class SpoolReplayer:
    """Replays ``spool`` in the background: ``soon`` schedules a replay (one at a time)
    on the database threads (``submit``); a replay that fails is tried again after a
    delay that starts at ``first_s`` and doubles up to ``max_s``."""

    def __init__(
        self,
        spool: RecordSpool,
        write: Callable[[list[PendingRecord]], None],
        submit: Callable[[Callable[[], None]], concurrent.futures.Future[None]],
        *,
        first_s: float = 1.0,
        max_s: float = 30.0,
    ) -> None:
        self.spool = spool
        self._write = write
        self._submit = submit
        self.first_s = first_s
        self.max_s = max_s
        self._delay_s = first_s
        self._lock = threading.Lock()
        self._scheduled = False

    def soon(self, delay_s: float | None = None) -> None:
        """Replay after ``delay_s`` (the current backoff when None), unless one is
        scheduled already."""
        with self._lock:
            if self._scheduled:
                return
            self._scheduled = True
            delay_s = self._delay_s if delay_s is None else delay_s
        timer = threading.Timer(delay_s, self._start)
        timer.daemon = True
        timer.start()

    def _start(self) -> None:
        try:
            self._submit(self._replay)
        except RuntimeError:  # the database threads are shut down: the process stops
            with self._lock:
                self._scheduled = False

    def _replay(self) -> None:
        with self._lock:
            self._scheduled = False
        try:
            replayed = self.spool.replay(self._write)
        except Exception as e:  # the database is still down (or the disk): try later
            with self._lock:
                self._delay_s = min(2 * self._delay_s, self.max_s)
            log.warning("spooled records not replayed yet: %r", e)
            self.soon()
            return
        with self._lock:
            self._delay_s = self.first_s
        # Another process replays now, or records were spooled while this one ran.
        if replayed is None or self.spool.pending():
            self.soon()
