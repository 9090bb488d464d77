"""Channels, the cache and Celery against the real Redis from REDIS_URL."""

from __future__ import annotations

import os
import subprocess
import time
import uuid

import pytest
from channels.layers import get_channel_layer
from django.core.cache import cache

from tests.conftest import REPO, VENV_BIN

REDIS_URL = os.environ.get("REDIS_URL", "")
pytestmark = pytest.mark.skipif(not REDIS_URL, reason="REDIS_URL is not set (make test sets it)")


async def test_channel_layer_group_round_trip() -> None:
    layer = get_channel_layer()
    assert type(layer).__name__ == "RedisChannelLayer"
    channel = await layer.new_channel()
    group = f"test-{uuid.uuid4().hex}"
    await layer.group_add(group, channel)
    await layer.group_send(group, {"type": "attainment.update", "tenant": "acme", "ttft": 0.98})
    message = await layer.receive(channel)
    assert message == {"type": "attainment.update", "tenant": "acme", "ttft": 0.98}
    await layer.group_discard(group, channel)
    await layer.flush()


def test_cache_is_redis_and_shared_across_connections() -> None:
    key = f"test:{uuid.uuid4().hex}"
    cache.set(key, {"rpm": 7}, timeout=30)
    import redis

    raw = redis.Redis.from_url(REDIS_URL)
    assert any(key in k.decode() for k in raw.scan_iter(f"*{key}*"))
    assert cache.get(key) == {"rpm": 7}
    cache.delete(key)
    assert cache.get(key) is None


@pytest.mark.slow
def test_worker_answers_a_control_ping_over_the_broker(clean_env: dict[str, str]) -> None:
    from shunter.project.celery import app

    name = f"test-{uuid.uuid4().hex[:8]}@localhost"
    env = {**clean_env, "REDIS_URL": REDIS_URL}
    worker = subprocess.Popen(
        [
            str(VENV_BIN / "shunter"),
            "worker",
            "--pool",
            "solo",
            "--hostname",
            name,
            "--without-gossip",
            "--without-mingle",
        ],
        cwd=REPO,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        deadline = time.monotonic() + 60
        replies: list[dict[str, object]] = []
        while time.monotonic() < deadline and not replies:
            replies = app.control.ping(destination=[name], timeout=1.0) or []
        assert replies == [{name: {"ok": "pong"}}]
    finally:
        worker.terminate()
        output, _ = worker.communicate(timeout=30)
    assert worker.returncode == 0, output
