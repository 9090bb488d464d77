"""Request bodies: vLLM's and OpenAI's sampling parameters taken, the ones the engine
does not implement refused with a 400 that says so, unknown ones ignored and named."""

from __future__ import annotations

from typing import Any

import pytest

from shunter.engine.api.errors import ApiError
from shunter.engine.api.protocol import parse_chat, parse_completion


class Info:
    name = "m"
    max_context = 256
    vocab_size = 100

    def encode(self, text: str, *, add_special_tokens: bool = True) -> list[int]:
        return [1 + len(word) % 50 for word in text.split()]

    def render_chat(
        self,
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]] | None = None,
        variables: dict[str, Any] | None = None,
    ) -> str:
        return " ".join(m["content"] for m in messages)


def parse(**fields: Any) -> Any:
    return parse_completion({"model": "m", "prompt": "a b c", **fields}, Info())


def refusal(**fields: Any) -> ApiError:
    with pytest.raises(ApiError) as e:
        parse(**fields)
    assert e.value.status == 400
    return e.value


def test_vllm_sampling_parameters_reach_the_sampler() -> None:
    params = parse(
        stop_token_ids=[7, 9],
        repetition_penalty=1.3,
        min_p=0.05,
        logit_bias={"12": 5, "3": -100},
    ).params
    assert params.stop_token_ids == (7, 9)
    assert params.repetition_penalty == 1.3 and params.min_p == 0.05
    assert params.logit_bias == ((3, -100.0), (12, 5.0))


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"stop_token_ids": [100]}, "stop_token_ids"),
        ({"stop_token_ids": "7"}, "stop_token_ids"),
        ({"repetition_penalty": 0}, "repetition_penalty"),
        ({"min_p": 2}, "min_p"),
        ({"logit_bias": {"x": 1}}, "logit_bias"),
        ({"logit_bias": {"5": 101}}, "logit_bias"),
        ({"logit_bias": [1]}, "logit_bias"),
    ],
)
def test_bad_values_name_their_parameter(fields: dict[str, Any], param: str) -> None:
    assert refusal(**fields).param == param


@pytest.mark.parametrize(
    ("fields", "says"),
    [
        ({"echo": True}, "'echo'"),
        ({"suffix": "end"}, "'suffix'"),
        ({"functions": [{"name": "f"}]}, "use 'tools'"),
        ({"function_call": "auto"}, "use 'tool_choice'"),
        # vLLM's: each would change the answer, so none is ignored silently.
        ({"structured_outputs": {"choice": ["yes", "no"]}}, "'response_format'"),
        ({"guided_choice": ["yes", "no"]}, "'response_format'"),
        ({"guided_regex": "[0-9]+"}, "guided decoding"),
        ({"guided_json": {"type": "object"}}, "'structured_outputs' since"),
        ({"guided_grammar": "root ::= 'a'"}, "'guided_grammar'"),
        ({"use_beam_search": True}, "beam search"),
        ({"include_stop_str_in_output": True}, "left out of the output"),
        ({"skip_special_tokens": False}, "other than true"),
        ({"truncate_prompt_tokens": 8}, "taken whole"),
        ({"prompt_logprobs": 1}, "'prompt_logprobs'"),
        ({"allowed_token_ids": [1, 2]}, "'logit_bias'"),
        ({"bad_words": ["x"]}, "'bad_words'"),
        ({"return_tokens_as_token_ids": True}, "'return_token_ids'"),
        ({"priority": 5}, "tenant's priority"),
        ({"priority": False}, "tenant's priority"),  # a boolean is not the integer 0
    ],
)
def test_what_the_engine_does_not_implement_is_refused_saying_so(
    fields: dict[str, Any], says: str
) -> None:
    error = refusal(**fields)
    assert says in error.message and "not supported" in error.message
    assert error.param == next(iter(fields))


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"add_generation_prompt": False}, "add_generation_prompt"),
        ({"continue_final_message": True}, "continue_final_message"),
        ({"chat_template": "{{ messages }}"}, "chat_template"),
        ({"guided_choice": ["a"]}, "guided_choice"),
    ],
)
def test_chat_refuses_what_its_template_cannot_do(fields: dict[str, Any], param: str) -> None:
    body = {"model": "m", "messages": [{"role": "user", "content": "a b"}], **fields}
    with pytest.raises(ApiError) as e:
        parse_chat(body, Info())
    assert e.value.status == 400 and e.value.param == param
    assert "not supported" in e.value.message


def test_what_changes_nothing_here_is_taken() -> None:
    request = parse(
        store=False,
        parallel_tool_calls=True,
        response_format={"type": "text"},
        best_of=2,
        n=2,
        echo=False,
        # vLLM's, asking for what the engine does anyway.
        skip_special_tokens=True,
        use_beam_search=False,
        include_stop_str_in_output=False,
        priority=0,
        bad_words=[],
    )
    assert request.n == 2 and request.ignored == ()
    chat = parse_chat(
        {
            "model": "m",
            "messages": [{"role": "user", "content": "a b"}],
            "add_generation_prompt": True,
            "continue_final_message": False,
        },
        Info(),
    )
    assert chat.ignored == ()


def test_unknown_fields_are_ignored_and_named() -> None:
    request = parse(misspelt=1, extra_thing={"a": 1}, temperature=0.5)
    assert request.ignored == ("extra_thing", "misspelt")
    assert request.params.temperature == 0.5  # the rest of the body is read as ever
    # A refused field is still refused, however many unknown ones come with it.
    assert refusal(misspelt=1, echo=True).param == "echo"


def test_completions_take_a_response_format_and_refuse_tools() -> None:
    request = parse(response_format={"type": "json_object"})
    assert request.params.grammar is not None and not request.structure.calls_tools
    error = refusal(tools=[{"type": "function", "function": {"name": "f"}}])
    assert error.param == "tools" and "chat" in error.message


def test_best_of_runs_more_sequences_and_ranks_them_by_log_probability() -> None:
    request = parse(n=2, best_of=4, temperature=1.0)
    assert (request.n, request.runs_per_prompt) == (2, 4)
    assert request.params.logprobs == 0 and not request.logprobs_shown  # ranking only
    shown = parse(n=1, best_of=3, logprobs=2)
    assert shown.params.logprobs == 2 and shown.logprobs_shown
    assert parse(n=2).runs_per_prompt == 2 and parse(n=2).best_of == 2
    assert refusal(n=3, best_of=2).param == "best_of"
    assert refusal(best_of=2, stream=True).param == "best_of"
    assert refusal(best_of=9).param == "best_of"  # beyond MAX_N


@pytest.mark.parametrize(
    ("kwargs", "says"),
    [
        ([1], "'chat_template_kwargs' must be a valid dictionary"),
        ({"messages": []}, "may not set messages"),
        ({"add_generation_prompt": False, "bos_token": "x"}, "add_generation_prompt, bos_token"),
        ({"raise_exception": "x"}, "may not set raise_exception"),
    ],
)
def test_template_variables_may_not_replace_the_requests_own(kwargs: Any, says: str) -> None:
    body = {"model": "m", "messages": [{"role": "user", "content": "a"}]}
    with pytest.raises(ApiError) as e:
        parse_chat({**body, "chat_template_kwargs": kwargs}, Info())
    assert e.value.status == 400 and e.value.param == "chat_template_kwargs"
    assert says in e.value.message
