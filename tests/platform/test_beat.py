"""One beat at a time: the lease in Redis, then two real ``shunter beat`` processes of
which the second idles until the first stops."""

from __future__ import annotations

import os
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from shunter.platform.beat import BeatLock, LeaderScheduler
from shunter.project.celery import app
from tests import waiting
from tests.benchmarks.test_worker import process_env
from tests.conftest import VENV_BIN, Process

REDIS_URL = os.environ.get("REDIS_URL", "")
pytestmark = pytest.mark.skipif(not REDIS_URL, reason="REDIS_URL is not set (make test sets it)")


@pytest.fixture
def client() -> Iterator[redis.Redis]:
    c = redis.Redis.from_url(REDIS_URL)
    yield c
    c.close()


def test_the_lease_has_one_holder_until_it_is_released_or_expires(client: redis.Redis) -> None:
    key = f"test:beat:{uuid.uuid4().hex[:8]}"
    first = BeatLock(client, ttl_s=30, key=key, owner="first")
    second = BeatLock(client, ttl_s=0.3, key=key, owner="second")
    assert first.hold() and not second.hold()
    assert first.hold()  # renewed by its holder
    assert second.holder() == "first"
    second.release()  # not its lease: nothing happens
    assert first.holder() == "first"
    first.release()
    assert first.holder() is None
    assert second.hold() and not first.hold()
    time.sleep(0.4)  # the second holder stops renewing: its lease runs out
    assert first.hold()
    first.release()
    # A renewal of the released holder that reaches Redis after its release (a beat
    # stopped mid-renewal) does not take the lease back; anyone else may take it.
    assert not first.hold() and first.holder() is None
    assert second.hold()
    with pytest.raises(ValueError, match="positive"):
        BeatLock(client, ttl_s=0)


@pytest.mark.django_db
def test_a_closed_beat_exits_at_its_next_tick_and_never_leads_again(client: redis.Redis) -> None:
    scheduler = LeaderScheduler(app=app, lazy=True)
    scheduler.lock = BeatLock(client, ttl_s=0.2, key=f"test:beat:{uuid.uuid4().hex[:8]}")
    assert scheduler._lead()  # what tick asks first: it holds the lease and runs
    # Celery's SIGTERM handler closes the scheduler, then raises SystemExit, which a
    # publish in flight may swallow: beat then ticks on.
    scheduler.close()
    assert scheduler.lock.holder() is None
    time.sleep(0.3)  # the release's tombstone expires: the lease is anyone's
    with pytest.raises(SystemExit):
        scheduler.tick()
    assert scheduler.lock.holder() is None


@pytest.mark.slow
@pytest.mark.django_db(transaction=True, serialized_rollback=True)
def test_a_second_beat_idles_until_the_first_stops(client: redis.Redis, tmp_path: Path) -> None:
    client.delete("shunter:beat:leader")
    env = {**process_env(), "SHUNTER_BEAT_LOCK_TTL_S": "10"}
    command = [str(VENV_BIN / "shunter"), "beat"]
    first = Process(command, env, tmp_path / "first.log")
    second: Process | None = None
    try:
        waiting.wait_for(
            lambda: "holding the beat lock" in first.output(), 60, "the first beat to lead"
        )
        second = Process(command, env, tmp_path / "second.log")
        follower = second
        waiting.wait_for(
            lambda: "holds the beat lock; this one idles" in follower.output(),
            60,
            "the second beat to idle",
            detail=follower.output,
        )
        assert "holding the beat lock" not in follower.output()
        first.stop()  # releases the lease: the second takes over within its idle check
        waiting.wait_for(
            lambda: "holding the beat lock" in follower.output(),
            30,
            "the second beat to take over",
            detail=follower.output,
        )
    finally:
        first.stop()
        if second is not None:
            second.stop()
    assert BeatLock(client, ttl_s=1).holder() is None  # the last one released it too
