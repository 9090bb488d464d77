"""Each dependency on the gateway's request path failing, through real processes.

- Redis at admission, in every way a network fails (refused, a connection killed
  mid-command, no answer until the timeout, bytes that are not Redis'): a 503
  ``quota_unavailable`` with ``Retry-After``, never a 500.
- Redis at the release of a concurrency lease: the release is retried in the background,
  so the tenant gets its slot back as soon as Redis answers (not a 15-minute lockout).
- Engines that fail before any output (unreachable, refusing, closing the connection
  before any byte, dying after the headers): an OpenAI-format 503 or error event, the
  lease given back, a record written, and the request refunded from the
  requests-per-minute window.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import socket
import threading
import urllib.parse
from collections.abc import Iterator
from pathlib import Path
from typing import Literal

import pytest

from shunter.tenants.models import RequestRecord
from tests import faults
from tests.conftest import free_port
from tests.faults import FaultyProxy, Mode
from tests.gateway.conftest import (
    DB,
    HTTPS,
    REDIS_URL,
    Gateway,
    LlamaSetup,
    World,
    bearer,
    call,
    wait_record,
)
from tests.waiting import wait_for

pytestmark = [pytest.mark.slow, DB]


# -- Redis ---------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def redis_proxy() -> Iterator[FaultyProxy]:
    yield from faults.redis_proxy()


@pytest.fixture(scope="module")
def proxied_gateway(
    django_db_setup: None,
    redis_proxy: FaultyProxy,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Gateway]:
    """A second ``shunter web`` whose Redis is behind ``redis_proxy``."""
    url = urllib.parse.urlsplit(REDIS_URL)._replace(netloc=f"127.0.0.1:{redis_proxy.port}")
    log = tmp_path_factory.mktemp("proxied-gateway") / "gateway.log"
    gateway = Gateway(log, {"REDIS_URL": url.geturl()})
    yield gateway
    gateway.stop()


@pytest.fixture
def redis_faults(redis_proxy: FaultyProxy) -> Iterator[FaultyProxy]:
    redis_proxy.set("forward")
    yield redis_proxy
    redis_proxy.set("forward")


@pytest.mark.parametrize("fault", ["refuse", "kill", "hang", "junk"])
def test_every_redis_failure_at_admission_is_a_503_quota_unavailable(
    llama_setup: LlamaSetup, proxied_gateway: Gateway, redis_faults: FaultyProxy, fault: Mode
) -> None:
    tenant = llama_setup.world.tenant(llama_setup.llama, rpm_limit=100)
    _, secret = llama_setup.world.key(tenant)
    url = proxied_gateway.url
    assert llama_setup.completion(secret, url=url).status == 200
    redis_faults.set(fault)
    redis_faults.drop_connections()  # pooled connections die with the outage
    r = llama_setup.completion(secret, url=url)
    assert r.status == 503, r.body
    assert (r.error["type"], r.error["code"]) == ("service_unavailable", "quota_unavailable")
    assert r.headers["retry-after"] == "1"
    redis_faults.set("forward")
    assert llama_setup.completion(secret, url=url).status == 200  # served again at once


def test_a_lease_whose_release_redis_missed_is_given_back_when_redis_answers(
    llama_setup: LlamaSetup, proxied_gateway: Gateway, redis_faults: FaultyProxy
) -> None:
    tenant = llama_setup.world.tenant(llama_setup.llama, concurrency_limit=1)
    _, secret = llama_setup.world.key(tenant)
    conn = http.client.HTTPConnection("127.0.0.1", proxied_gateway.port, timeout=60)
    body = {"model": "llama", "prompt": "Go on", "max_tokens": 1900, "ignore_eos": True}
    rid = f"release-missed-{tenant.pk}"
    headers = {**HTTPS, **bearer(secret), "X-Request-Id": rid}
    conn.request("POST", "/v1/completions", json.dumps({**body, "stream": True}), headers)
    reply = conn.getresponse()
    assert reply.status == 200 and reply.readline().startswith(b"data: {")
    redis_faults.set("refuse")
    conn.close()  # the request ends while Redis cannot take its release
    record = wait_record(rid)  # written after the first, failed, release
    assert record.status == RequestRecord.Status.ABORTED
    assert llama_setup.completion(secret, url=proxied_gateway.url).status == 503
    redis_faults.set("forward")
    # Well within the lease's lifetime: the background retry gave it back.
    wait_for(
        lambda: llama_setup.completion(secret, url=proxied_gateway.url).status == 200,
        15,
        "the tenant's concurrency slot back",
        interval=0.2,
    )


# -- engines -------------------------------------------------------------------------------
Fault = Literal["close", "headers"]


class BrokenEngine:
    """A raw HTTP server that reads each request, then either closes the connection
    before any response byte (``close``) or sends the response's headers and closes
    before its body (``headers``)."""

    def __init__(self, fault: Fault) -> None:
        self.fault = fault
        self.server = socket.socket()
        self.server.bind(("127.0.0.1", 0))
        self.server.listen(16)
        self.url = f"http://127.0.0.1:{self.server.getsockname()[1]}"
        self.served = 0
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.server.accept()
            except OSError:
                return
            with conn:
                request = self._read_request(conn)
                self.served += 1
                if self.fault == "headers":
                    stream = b'"stream": true' in request
                    kind = b"text/event-stream" if stream else b"application/json"
                    head = b"HTTP/1.1 200 OK\r\nContent-Type: " + kind + b"\r\n"
                    head += b"X-Shunter-Prompt-Tokens: 3\r\n"
                    head += (
                        b"Transfer-Encoding: chunked\r\n" if stream else b"Content-Length: 500\r\n"
                    )
                    conn.sendall(head + b"\r\n")
                with contextlib.suppress(OSError):
                    conn.shutdown(socket.SHUT_RDWR)

    @staticmethod
    def _read_request(conn: socket.socket) -> bytes:
        data = b""
        while b"\r\n\r\n" not in data:
            chunk = conn.recv(65536)
            if not chunk:
                return data
            data += chunk
        head, _, body = data.partition(b"\r\n\r\n")
        length = 0
        for line in head.split(b"\r\n"):
            name, _, value = line.partition(b":")
            if name.strip().lower() == b"content-length":
                length = int(value)
        while len(body) < length and (chunk := conn.recv(65536)):
            body += chunk
        return body

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.server.shutdown(socket.SHUT_RDWR)
        self.server.close()


@pytest.fixture
def broken_engine(request: pytest.FixtureRequest) -> Iterator[BrokenEngine]:
    engine = BrokenEngine(request.param)
    yield engine
    engine.close()


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("broken_engine", ["close", "headers"], indirect=True)
def test_an_engine_that_fails_before_its_first_byte_of_output(
    world: World, broken_engine: BrokenEngine, stream: bool
) -> None:
    broken = world.deployment(world.node("broken-node", broken_engine.url), "broken")
    working = world.deployment(world.node("working-node", world.engine.url), "llama")
    tenant = world.tenant(broken, working, rpm_limit=1, concurrency_limit=1)
    _, secret = world.key(tenant)
    rid = f"broken-{broken_engine.fault}-{stream}-{tenant.pk}"
    body = {"model": "broken", "prompt": "hi", "max_tokens": 4, "stream": stream}
    headers = {**bearer(secret), "X-Request-Id": rid}
    r = call("POST", world.gateway.url + "/v1/completions", body, headers=headers)
    assert broken_engine.served >= 1
    # Even a stream whose head came: the client gets it only with the first event, so
    # nothing had reached the client and the answer is a plain 503.
    assert r.status == 503, r.body
    error = r.error
    assert (error["type"], error["code"]) == ("service_unavailable", "engine_unavailable")
    record = wait_record(rid)  # written after the lease was given back and refunded
    assert (record.status, record.error_type) == ("error", "engine_unavailable")
    assert record.completion_tokens == 0
    # Its lease is back and it does not count as the minute's one request.
    r = call(
        "POST",
        world.gateway.url + "/v1/completions",
        {**body, "model": "llama"},
        headers=bearer(secret),
    )
    assert r.status == 200, r.body
    assert r.headers["x-ratelimit-remaining-requests"] == "0"


def test_requests_the_engines_failed_before_accepting_them_do_not_count_per_minute(
    world: World, model_dirs: dict[str, Path]
) -> None:
    ghost = world.deployment(world.node("ghost-node", f"http://127.0.0.1:{free_port()}"), "ghost")
    node = world.node("wrong-token-node", world.engine.url)
    node.set_engine_token("not-the-engine-token")
    node.save()
    refusing = world.deployment(node, "qwen")
    working = world.deployment(world.node("rpm-node", world.engine.url), "llama")
    tenant = world.tenant(ghost, refusing, working, rpm_limit=3)
    _, secret = world.key(tenant)
    url = world.gateway.url + "/v1/completions"

    def completion(model: str, rid: str, **extra: object) -> int:
        body = {"model": model, "prompt": "Hello", "max_tokens": 1, **extra}
        r = call("POST", url, body, headers={**bearer(secret), "X-Request-Id": rid})
        if r.status not in (200, 429):  # forwarded, and failed: its accounting is done
            wait_record(rid)
        return r.status

    tag = tenant.pk
    failed = [completion("ghost", f"ghost-{i}-{tag}") for i in range(3)]
    failed.append(completion("qwen", f"token-{tag}"))  # the engine refuses the gateway
    # ... and the body: a prompt and max_tokens beyond the model's context.
    failed.append(completion("llama", f"refused-{tag}", max_tokens=10**6))
    assert failed == [503, 503, 503, 503, 400]
    # A field of the wrong type: the gateway refuses it itself, before admission.
    body = {"model": "llama", "prompt": "Hello", "temperature": "hot"}
    assert call("POST", url, body, headers=bearer(secret)).status == 400
    served = [completion("llama", f"served-{i}-{tag}") for i in range(4)]
    assert served == [200, 200, 200, 429]
