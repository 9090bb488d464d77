"""The official openai SDK against a real ``shunter engine`` process (a subprocess on a
loopback port, with a token), which exits 0 on SIGTERM once the tests are done."""

from __future__ import annotations

import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import openai
import pytest
from openai.types.chat import ChatCompletionMessageParam

from tests.conftest import REPO, VENV_BIN, free_port
from tests.engine.server.conftest import request

pytestmark = pytest.mark.slow

TOKEN = "process-token"
CHAT: list[ChatCompletionMessageParam] = [{"role": "user", "content": "Which car goes first?"}]


class EngineProcess:
    """``shunter engine --token`` on CPU serving ``llama`` (temporal) and ``qwen``
    (spatial), its output in ``log``."""

    def __init__(self, model_dirs: dict[str, Path], log: Path) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = log
        command = [
            str(VENV_BIN / "shunter"),
            "engine",
            "--device",
            "cpu",
            "--port",
            str(self.port),
            "--token",
            TOKEN,
            "--kv-tokens",
            "4096",
            "--grace",
            "5",
            "--check-integrity",
            "--model",
            f"llama={model_dirs['tiny-llama']}:temporal",
            "--model",
            f"qwen={model_dirs['tiny-qwen2']}:spatial",
        ]
        with log.open("wb") as out:
            self.proc = subprocess.Popen(command, cwd=REPO, stdout=out, stderr=subprocess.STDOUT)

    def wait_healthy(self, timeout: float = 180.0) -> None:
        deadline = time.monotonic() + timeout
        while True:
            try:
                if request("GET", self.url + "/health").status_code == 200:
                    return
            except OSError:
                pass
            assert self.proc.poll() is None, f"the engine exited:\n{self.output()}"
            assert time.monotonic() < deadline, f"the engine did not come up:\n{self.output()}"
            time.sleep(0.1)

    def terminate(self, timeout: float = 60.0) -> int:
        """SIGTERM, then the exit status (killed after ``timeout`` seconds)."""
        self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            raise

    def output(self) -> str:
        return self.log.read_text(errors="replace")[-4000:]


@pytest.fixture(scope="module")
def engine(model_dirs: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The engine's URL; at teardown the process must exit 0 on SIGTERM."""
    proc = EngineProcess(model_dirs, tmp_path_factory.mktemp("engine") / "engine.log")
    try:
        proc.wait_healthy()
        yield proc.url
    finally:
        if proc.proc.poll() is None:
            status = proc.terminate()
            assert status == 0, f"exit status {status}:\n{proc.output()}"


@pytest.fixture(scope="module")
def client(engine: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=engine + "/v1", api_key=TOKEN, max_retries=0, timeout=120)


def test_models_list(client: openai.OpenAI) -> None:
    models = client.models.list()
    assert sorted(m.id for m in models) == ["llama", "qwen"]
    assert all(m.object == "model" for m in models)


def test_completion_of_a_prompt_string(client: openai.OpenAI) -> None:
    out = client.completions.create(model="llama", prompt="The yard", max_tokens=4, temperature=0)
    assert out.object == "text_completion" and out.model == "llama"
    (choice,) = out.choices
    assert choice.index == 0 and choice.finish_reason in ("length", "stop")
    assert out.usage is not None and 1 <= out.usage.completion_tokens <= 4
    assert out.usage.total_tokens == out.usage.prompt_tokens + out.usage.completion_tokens


def test_completion_of_a_prompt_list_with_n_2(client: openai.OpenAI) -> None:
    prompts = ["The yard", "A signal box"]
    kwargs: dict[str, Any] = {
        "model": "qwen",
        "max_tokens": 3,
        "temperature": 0,
        "extra_body": {"ignore_eos": True},
    }
    out = client.completions.create(prompt=prompts, n=2, **kwargs)
    assert [c.index for c in out.choices] == [0, 1, 2, 3]
    # Choices run prompt by prompt, n of each; greedy samples of one prompt agree.
    for i, prompt in enumerate(prompts):
        alone = client.completions.create(prompt=prompt, **kwargs)
        assert out.choices[2 * i].text == out.choices[2 * i + 1].text == alone.choices[0].text
    assert out.usage is not None and out.usage.completion_tokens == 4 * 3


def test_chat_completion(client: openai.OpenAI) -> None:
    out = client.chat.completions.create(
        model="qwen", messages=CHAT, max_completion_tokens=5, temperature=0
    )
    assert out.object == "chat.completion"
    (choice,) = out.choices
    assert choice.message.role == "assistant" and isinstance(choice.message.content, str)
    assert out.usage is not None and out.usage.completion_tokens <= 5


def test_chat_n_2(client: openai.OpenAI) -> None:
    out = client.chat.completions.create(
        model="llama", messages=CHAT, n=2, max_tokens=4, temperature=1.0, seed=3
    )
    assert [c.index for c in out.choices] == [0, 1]
    assert all(c.message.role == "assistant" for c in out.choices)


def test_chat_stream_puts_usage_last(client: openai.OpenAI) -> None:
    stream = client.chat.completions.create(
        model="llama",
        messages=CHAT,
        max_tokens=6,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
        extra_body={"ignore_eos": True},
    )
    chunks = list(stream)
    assert chunks[0].choices[0].delta.role == "assistant"
    assert all(c.usage is None for c in chunks[:-1])
    last = chunks[-1]
    assert last.choices == [] and last.usage is not None
    assert last.usage.completion_tokens == 6
    assert chunks[-2].choices[0].finish_reason == "length"
    streamed = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    whole = client.chat.completions.create(
        model="llama", messages=CHAT, max_tokens=6, temperature=0, extra_body={"ignore_eos": True}
    )
    assert streamed == whole.choices[0].message.content


def _assert_openai_error(e: openai.APIStatusError, status: int) -> dict[str, object]:
    body = e.response.json()
    assert e.status_code == status
    assert set(body) == {"error"}
    assert set(body["error"]) == {"message", "type", "param", "code"}
    assert isinstance(body["error"]["message"], str) and body["error"]["message"]
    return dict(body["error"])


def test_a_bad_parameter_is_a_400(client: openai.OpenAI) -> None:
    with pytest.raises(openai.BadRequestError) as e:
        client.completions.create(model="llama", prompt="x", max_tokens=2, temperature=9)
    error = _assert_openai_error(e.value, 400)
    assert error["param"] == "temperature"


def test_an_unknown_model_is_a_404(client: openai.OpenAI) -> None:
    with pytest.raises(openai.NotFoundError) as e:
        client.chat.completions.create(model="gpt-9", messages=CHAT, max_tokens=1)
    error = _assert_openai_error(e.value, 404)
    assert error["code"] == "model_not_found" and error["param"] == "model"


def test_no_token_is_a_401(engine: str) -> None:
    anonymous = openai.OpenAI(base_url=engine + "/v1", api_key="unused", max_retries=0)
    with pytest.raises(openai.AuthenticationError) as e:
        anonymous.models.list(extra_headers={"Authorization": openai.Omit()})
    assert "authorization" not in e.value.response.request.headers
    _assert_openai_error(e.value, 401)
    wrong = openai.OpenAI(base_url=engine + "/v1", api_key="not-the-token", max_retries=0)
    with pytest.raises(openai.AuthenticationError):
        wrong.completions.create(model="llama", prompt="x", max_tokens=1)
