"""EngineCore serving real models: the tokens of transformers, whatever rotation happened."""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM, PreTrainedModel

from shunter.engine.api.structured import json_grammar
from shunter.engine.config import EngineConfig, RotationConfig, SchedulerConfig, TenantSpec
from shunter.engine.exec.params import SamplingParams
from shunter.engine.exec.serving import TorchEngine, model_specs
from shunter.engine.plan import BlockMove, StepPlan
from tests.engine.exec.conftest import CPU

PAGE = 16 * 1024
BLOCK_TOKENS = 4
MODELS = ("tiny-llama", "tiny-qwen2")
# Pages of weights at 16 KiB: two layers of 12 pages, plus embeddings and head.
WEIGHT_PAGES = {"tiny-llama": 2 * 12 + 17, "tiny-qwen2": 2 * 12 + 9}
NEW_TOKENS = 24
# A short JSON object, for constrained output.
SCHEMA = {
    "type": "object",
    "properties": {"n": {"type": "integer", "minimum": 0, "maximum": 9}},
    "required": ["n"],
    "additionalProperties": False,
}


def prompts(count: int) -> list[list[int]]:
    gen = torch.Generator().manual_seed(11)
    return [torch.randint(4, 500, (5 + 3 * i,), generator=gen).tolist() for i in range(count)]


@cache
def hf_model(model_dir: Path) -> PreTrainedModel:
    return AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)


def hf_greedy(model_dir: Path, prompt: list[int]) -> list[int]:
    with torch.no_grad():
        out = hf_model(model_dir).generate(
            torch.tensor([prompt]),
            max_new_tokens=NEW_TOKENS,
            min_new_tokens=NEW_TOKENS,
            do_sample=False,
            pad_token_id=0,
        )
    return [int(t) for t in out[0, len(prompt) :]]


def engine(
    dirs: dict[str, Path],
    *,
    kv_pages: int,
    rotation: RotationConfig | None = None,
    names: tuple[str, ...] = MODELS,
    max_batch_tokens: int = 64,
    async_scheduling: bool = False,
) -> TorchEngine:
    models = {name: dirs[name] for name in names}
    config = EngineConfig(
        models=model_specs(models),
        device_bytes=(sum(WEIGHT_PAGES[n] for n in names) + kv_pages) * PAGE,
        host_swap_bytes=4 * 1024 * 1024,
        page_bytes=PAGE,
        block_tokens=BLOCK_TOKENS,
        scheduler=SchedulerConfig(policy="lvf", max_batch_tokens=max_batch_tokens),
        rotation=rotation or RotationConfig(eager=False),
        check_integrity=True,
        async_scheduling=async_scheduling,
    )
    return TorchEngine(models, config, device=CPU)


def serve_all(eng: TorchEngine, work: list[tuple[str, list[int]]]) -> list[list[int]]:
    # min_tokens bans EOS, as transformers' min_new_tokens does.
    params = SamplingParams(temperature=0, max_tokens=NEW_TOKENS, min_tokens=NEW_TOKENS)
    ids = [eng.add_request(model, prompt, params) for model, prompt in work]
    outputs = eng.run()
    assert set(outputs) == set(ids)
    assert all(outputs[i].finish_reason == "length" for i in ids)
    return [outputs[i].output_ids for i in ids]


def workload(models: tuple[str, ...] = MODELS) -> list[tuple[str, list[int]]]:
    return [(models[i % len(models)], p) for i, p in enumerate(prompts(8))]


@pytest.mark.parametrize("max_batch_tokens", [64, 7], ids=["whole", "chunked"])
def test_greedy_tokens_through_the_engine_equal_transformers(
    max_batch_tokens: int, tiny_dirs: dict[str, Path]
) -> None:
    work = workload()
    outputs = serve_all(engine(tiny_dirs, kv_pages=64, max_batch_tokens=max_batch_tokens), work)
    for (model, prompt), output in zip(work, outputs, strict=True):
        assert output == hf_greedy(tiny_dirs[model], prompt), model


@pytest.mark.parametrize("model", MODELS)
def test_rotation_under_a_tight_budget_keeps_the_tokens(
    model: str, tiny_dirs: dict[str, Path]
) -> None:
    work = workload((model,))
    ample = serve_all(engine(tiny_dirs, kv_pages=64, names=(model,)), work)
    # Three pages of 8 blocks for 8 requests of up to 13 blocks each: they take turns,
    # and eager rotation copies every full block to host as soon as it is written.
    tight = engine(
        tiny_dirs,
        kv_pages=3,
        rotation=RotationConfig(budget_blocks=64, watermark=0),
        names=(model,),
    )
    assert serve_all(tight, work) == ample
    totals = tight.totals
    assert totals.preemptions > 0
    assert totals.blocks_swapped_out > 0 and totals.blocks_swapped_in > 0
    assert totals.blocks_rotated > 0


def test_seeded_sampling_does_not_depend_on_the_other_requests(
    tiny_dirs: dict[str, Path],
) -> None:
    params = SamplingParams(temperature=0.8, top_p=0.9, seed=5, max_tokens=12, ignore_eos=True)
    prompt = prompts(3)[2]
    alone = engine(tiny_dirs, kv_pages=64)
    rid = alone.add_request("tiny-llama", prompt, params)
    expected = alone.run()[rid].output_ids
    crowded = engine(tiny_dirs, kv_pages=64)
    for p in prompts(5):
        crowded.add_request("tiny-llama", p, SamplingParams(temperature=1.0, max_tokens=9))
    rid = crowded.add_request("tiny-llama", prompt, params)
    assert crowded.run()[rid].output_ids == expected


def test_stop_strings_end_requests_with_their_text_cut(tiny_dirs: dict[str, Path]) -> None:
    eng = engine(tiny_dirs, kv_pages=64)
    params = SamplingParams(temperature=0, max_tokens=NEW_TOKENS, min_tokens=NEW_TOKENS)
    probe = eng.add_request("tiny-llama", prompts(1)[0], params)
    full = eng.run()[probe].text
    stop = full[len(full) // 2 : len(full) // 2 + 2]
    assert stop
    rid = eng.add_request(
        "tiny-llama",
        prompts(1)[0],
        SamplingParams(temperature=0, max_tokens=NEW_TOKENS, stop=(stop,)),
    )
    out = eng.run()[rid]
    assert out.finish_reason == "stop"
    assert out.text == full[: full.index(stop)]
    assert len(out.output_ids) < NEW_TOKENS


def test_async_scheduling_keeps_the_tokens_through_rotation(tiny_dirs: dict[str, Path]) -> None:
    """Each step planned while the one before runs, under a budget that rotates
    requests between steps: the tokens of the sequential loop, and no block left."""
    work = workload()
    ample = serve_all(engine(tiny_dirs, kv_pages=64), work)
    rotation = RotationConfig(budget_blocks=64, watermark=0)
    tight = engine(tiny_dirs, kv_pages=5, rotation=rotation, async_scheduling=True)
    assert serve_all(tight, work) == ample
    assert tight.totals.preemptions > 0 and tight.totals.blocks_swapped_in > 0
    assert tight.core.is_idle()
    assert all(n == 0 for n in tight.core.memory.blocks_used().values())


def test_async_scheduling_ends_stopped_requests_as_the_sequential_loop_does(
    tiny_dirs: dict[str, Path],
) -> None:
    """Requests that stop on a token, a string or their grammar's end are in the next
    plan already: that entry is computed and dropped, and the outputs are those of the
    sequential loop."""
    probe_engine = engine(tiny_dirs, kv_pages=64)
    params = SamplingParams(temperature=0, max_tokens=NEW_TOKENS, min_tokens=NEW_TOKENS)
    work = workload()
    probes = [probe_engine.add_request(m, p, params) for m, p in work]
    full = probe_engine.run()
    asks = []
    for i, (rid, (model, prompt)) in enumerate(zip(probes, work, strict=True)):
        out = full[rid]
        if i % 4 == 3:  # constrained to a JSON schema: the grammar ends it
            stop = SamplingParams(
                temperature=0, max_tokens=4 * NEW_TOKENS, grammar=json_grammar(SCHEMA, "schema")
            )
        elif i % 3 == 0:  # stop on the token sampled at the middle
            stop = SamplingParams(
                temperature=0,
                max_tokens=NEW_TOKENS,
                stop_token_ids=(out.output_ids[NEW_TOKENS // 2],),
            )
        elif i % 3 == 1:  # stop on a string from the middle of the text
            middle = len(out.text) // 2
            stop = SamplingParams(
                temperature=0, max_tokens=NEW_TOKENS, stop=(out.text[middle : middle + 2],)
            )
        else:  # a length of its own
            stop = SamplingParams(temperature=0, max_tokens=3 + i, ignore_eos=True)
        asks.append((model, prompt, stop))

    def serve(eng: TorchEngine) -> list[tuple[list[int], str, str | None]]:
        ids = [eng.add_request(m, p, params) for m, p, params in asks]
        outputs = eng.run()
        return [(outputs[i].output_ids, outputs[i].text, outputs[i].finish_reason) for i in ids]

    sequential = serve(engine(tiny_dirs, kv_pages=64))
    pipelined = engine(tiny_dirs, kv_pages=64, async_scheduling=True)
    assert serve(pipelined) == sequential
    assert {reason for _, _, reason in sequential} == {"stop", "length"}
    assert all(json.loads(text) for _, text, _ in sequential[3::4])
    assert all(n == 0 for n in pipelined.core.memory.blocks_used().values())
    pipelined.core.close()


def test_async_scheduling_adds_a_model_while_a_step_is_in_flight(
    tiny_dirs: dict[str, Path],
) -> None:
    """A model added between two steps, with the next step's forward pass running: the
    change waits for it, and both models' requests get transformers' tokens."""
    eng = engine(tiny_dirs, kv_pages=96, names=("tiny-llama",), async_scheduling=True)
    params = SamplingParams(temperature=0, max_tokens=NEW_TOKENS, min_tokens=NEW_TOKENS)
    work = prompts(4)
    llama = [eng.add_request("tiny-llama", p, params) for p in work[:2]]
    for _ in range(3):
        eng.step()
    assert eng.core.step_in_flight
    prepared = eng.prepare_model("tiny-qwen2", tiny_dirs["tiny-qwen2"])
    eng.change_models([], [(prepared, TenantSpec("tiny-qwen2"), 64)])
    qwen = [eng.add_request("tiny-qwen2", p, params) for p in work[2:]]
    outputs = eng.run()
    for rid, prompt in zip(llama, work[:2], strict=True):
        assert outputs[rid].output_ids == hf_greedy(tiny_dirs["tiny-llama"], prompt)
    for rid, prompt in zip(qwen, work[2:], strict=True):
        assert outputs[rid].output_ids == hf_greedy(tiny_dirs["tiny-qwen2"], prompt)
    eng.core.close()


def test_config_must_match_the_model_directories(tiny_dirs: dict[str, Path]) -> None:
    models = {"tiny-llama": tiny_dirs["tiny-llama"]}
    config = EngineConfig(
        models=model_specs(models, torch.bfloat16),
        device_bytes=64 * PAGE,
        host_swap_bytes=0,
        page_bytes=PAGE,
    )
    with pytest.raises(ValueError, match="model_specs"):
        TorchEngine(models, config, device=CPU)


def test_block_moves_happen_before_the_step_reads_kv(tiny_dirs: dict[str, Path]) -> None:
    eng = engine(tiny_dirs, kv_pages=4, names=("tiny-llama",))
    kv = eng.executor.models["tiny-llama"].kv_cache
    kv[3].fill_(7.0)
    eng.executor.execute(StepPlan(step=0, moves={"tiny-llama": [BlockMove(3, 9)]}))
    assert kv[9].unique().tolist() == [7.0]
