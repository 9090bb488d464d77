"""The web server's access log (``shunter web``) never holds a query string's values:
clients put keys there (``?api_key=sk-...``)."""

from __future__ import annotations

import http.client
import logging
import time

import pytest

from shunter.platform.access_log import RedactQuery, redact_query
from tests.gateway.conftest import DB, HTTPS, Gateway


@pytest.mark.parametrize(
    ("path", "logged"),
    [
        ("/v1/models", "/v1/models"),
        ("/v1/models?api_key=sk-1&limit=5", "/v1/models?api_key=REDACTED&limit=REDACTED"),
        ("/ws/overview?sk-bare&x=", "/ws/overview?REDACTED&x=REDACTED"),
    ],
)
def test_query_values_are_redacted(path: str, logged: str) -> None:
    assert redact_query(path) == logged


def test_the_filter_redacts_websocket_lines_too() -> None:
    # uvicorn's websocket line: '%s - "WebSocket %s" [accepted]' on uvicorn.error.
    args = ("127.0.0.1:5000", "/ws/console/?token=sk-ws")
    line = '%s - "WebSocket %s"'
    record = logging.LogRecord("uvicorn.error", logging.INFO, "", 0, line, args, None)
    assert RedactQuery().filter(record)
    assert record.getMessage() == '127.0.0.1:5000 - "WebSocket /ws/console/?token=REDACTED"'


@pytest.mark.slow
@DB
def test_the_access_log_of_the_web_process_redacts_query_values(gateway: Gateway) -> None:
    secret = "sk-in-a-query-string-0123456789"
    conn = http.client.HTTPConnection("127.0.0.1", gateway.port, timeout=30)
    try:  # not ``call``: it sends the path alone
        conn.request("GET", f"/v1/models?api_key={secret}&limit=5", headers=HTTPS)
        assert conn.getresponse().status == 401
    finally:
        conn.close()
    line = "GET /v1/models?api_key=REDACTED&limit=REDACTED HTTP/1.1"
    deadline = time.monotonic() + 15
    while line not in gateway.output():
        assert time.monotonic() < deadline, gateway.output()[-2000:]
        time.sleep(0.05)
    assert secret not in gateway.output()
