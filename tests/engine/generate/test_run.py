"""``shunter generate``: real models through EngineCore, offline, from the command line."""

from __future__ import annotations

import json
import shutil
from functools import cache
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file
from tokenizers import Tokenizer, decoders, models
from transformers import AutoModelForCausalLM, PreTrainedModel

from shunter.engine.checkpoint.random_weights import init_model_dir, preset_config
from shunter.engine.exec.forced_remap import EVERY_LAYER
from shunter.engine.exec.serving import model_specs
from shunter.engine.exec.sizing import BLOCK_TOKENS, page_bytes_for, weight_bytes
from shunter.engine.generate.run import GenerateResult, generate_from_args
from shunter.project.cli import build_parser, main

MODELS = ("tiny-llama", "tiny-qwen2")


@cache
def hf_model(model_dir: Path) -> PreTrainedModel:
    return AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)


def hf_greedy(model_dir: Path, prompt: list[int], max_tokens: int) -> list[int]:
    """transformers' greedy tokens, up to and including the first EOS (as ours end)."""
    model = hf_model(model_dir)
    with torch.no_grad():
        out = model.generate(
            torch.tensor([prompt]), max_new_tokens=max_tokens, do_sample=False, pad_token_id=0
        )
    tokens = [int(t) for t in out[0, len(prompt) :]]
    eos = set(model.generation_config.eos_token_id)
    ends = [i for i, t in enumerate(tokens) if t in eos]
    return tokens[: ends[0] + 1] if ends else tokens


def model_args(dirs: dict[str, Path]) -> list[str]:
    return [arg for name in MODELS for arg in ("--model", f"{name}={dirs[name]}")]


def run_json(args: list[str], capsys: pytest.CaptureFixture[str]) -> list[dict[str, object]]:
    assert main(["generate", *args, "--json"]) == 0
    return [json.loads(line) for line in capsys.readouterr().out.splitlines()]


def prompts(count: int, seed: int = 7) -> list[list[int]]:
    gen = torch.Generator().manual_seed(seed)
    lengths = torch.randint(3, 40, (count,), generator=gen).tolist()
    return [torch.randint(4, 500, (n,), generator=gen).tolist() for n in lengths]


def write_requests(path: Path, lines: list[dict[str, object]]) -> Path:
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    return path


def generate(args: list[str]) -> GenerateResult:
    """The CLI's run, with the memory integrity check after every step."""
    return generate_from_args(build_parser().parse_args(["generate", *args]), check_integrity=True)


def test_greedy_tokens_equal_transformers_generate(
    tiny_dirs: dict[str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    prompt = prompts(1)[0]
    ids = ",".join(map(str, prompt))
    args = [*model_args(tiny_dirs), "--prompt-ids", ids, "--max-tokens", "32", "--greedy"]
    *outputs, summary = run_json(args, capsys)
    assert [o["model"] for o in outputs] == list(MODELS)  # the prompt goes to every model
    for out in outputs:
        assert out["prompt_ids"] == prompt
        assert out["output_ids"] == hf_greedy(tiny_dirs[str(out["model"])], prompt, 32)
    assert set(summary["summary"]) == {  # type: ignore[arg-type]
        "rotations",
        "blocks_swapped_out",
        "blocks_swapped_in",
        "remapped_layers_max",
        "layers_streamed",
        "layers_restored",
        "steps",
        "prefix_cache_queries",
        "prefix_cache_hits",
        "prefix_cache_host_hits",
        "warnings",
    }
    assert summary["summary"]["warnings"] == []  # type: ignore[index]


def test_text_prompts_are_tokenized_by_each_model(
    tiny_dirs: dict[str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    text = "The shunter moves cars 🚂"
    *outputs, _ = run_json(
        [*model_args(tiny_dirs), "--prompt", text, "--max-tokens", "6", "--greedy"], capsys
    )
    for out in outputs:
        tokenizer = Tokenizer.from_file(str(tiny_dirs[str(out["model"])] / "tokenizer.json"))
        assert out["prompt_ids"] == tokenizer.encode(text).ids
        output_ids = out["output_ids"]
        assert isinstance(output_ids, list)
        eos = set(hf_model(tiny_dirs[str(out["model"])]).generation_config.eos_token_id)
        ids = [t for t in output_ids if t not in eos]
        assert out["text"] == tokenizer.decode(ids, skip_special_tokens=True)


def test_request_files_keep_input_order_and_mix_models(
    tmp_path: Path, tiny_dirs: dict[str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    lines: list[dict[str, object]] = [
        {"model": MODELS[i % 2], "prompt_ids": p, "max_tokens": 3 + i}
        for i, p in enumerate(prompts(5))
    ]
    lines.append({"model": "tiny-qwen2", "prompt": "hello"})  # max_tokens from the flag
    path = write_requests(tmp_path / "requests.jsonl", lines)
    args = [*model_args(tiny_dirs), "--requests", str(path), "--max-tokens", "4", "--greedy"]
    *outputs, _ = run_json(args, capsys)
    assert [o["model"] for o in outputs] == [line["model"] for line in lines]
    assert [o["prompt_ids"] for o in outputs[:5]] == [line["prompt_ids"] for line in lines[:5]]
    for out, line in zip(outputs, lines, strict=True):
        output_ids = out["output_ids"]
        assert isinstance(output_ids, list)
        assert 1 <= len(output_ids) <= int(str(line.get("max_tokens", 4)))


def test_many_requests_on_two_models_keep_their_tokens_when_memory_is_tight(
    tmp_path: Path, tiny_dirs: dict[str, Path]
) -> None:
    """Forced rotation under a budget that holds a few requests of each model at a time
    gives exactly the tokens of a run with room for all, and the memory integrity check
    passes after every step."""
    work = prompts(16, seed=3)
    lines: list[dict[str, object]] = [
        {"model": MODELS[i % 2], "prompt_ids": p, "max_tokens": 20} for i, p in enumerate(work)
    ]
    path = write_requests(tmp_path / "requests.jsonl", lines)
    base = [*model_args(tiny_dirs), "--requests", str(path), "--max-tokens", "20", "--greedy"]
    ample = generate(base)
    assert ample.summary["rotations"] == 0

    specs = model_specs({name: tiny_dirs[name] for name in MODELS})
    page = page_bytes_for(specs, BLOCK_TOKENS)
    assert page == specs[0].block_bytes(BLOCK_TOKENS)  # one block per page
    # Each model's share holds its longest request and a little more (4 of 16 blocks).
    longest = max(-(-(len(p) + 20) // BLOCK_TOKENS) for p in work)
    budget = weight_bytes(specs, page) + len(MODELS) * (longest + 1) * page
    tight = generate([*base, "--hbm-budget", str(budget), "--force-rotation"])

    assert tight.outputs == ample.outputs
    summary = tight.summary
    assert summary["rotations"] > len(work)
    assert summary["blocks_swapped_out"] > 0 and summary["blocks_swapped_in"] > 0
    assert summary["steps"] > ample.summary["steps"]
    assert summary["remapped_layers_max"] == 0  # nothing remaps layers yet


def shared_prefix_prompts(count: int, prefix_len: int, seed: int = 5) -> list[list[int]]:
    """``count`` prompts: one of two common prefixes, then a short suffix of their own."""
    gen = torch.Generator().manual_seed(seed)
    heads = [torch.randint(4, 500, (prefix_len,), generator=gen).tolist() for _ in range(2)]
    return [
        heads[i % 2] + torch.randint(4, 500, (3 + i % 5,), generator=gen).tolist()
        for i in range(count)
    ]


def test_shared_prefixes_keep_their_tokens_under_forced_rotation(
    tmp_path: Path, tiny_dirs: dict[str, Path]
) -> None:
    """Prefix caching serves later requests' prompts from earlier ones' blocks, shared
    while both run and cached once they finish, through forced rotation under a tight
    budget: the tokens are those of a run without it."""
    work = shared_prefix_prompts(12, prefix_len=40)
    lines: list[dict[str, object]] = [
        {"model": MODELS[i % 2], "prompt_ids": p, "max_tokens": 12} for i, p in enumerate(work)
    ]
    path = write_requests(tmp_path / "requests.jsonl", lines)
    base = [*model_args(tiny_dirs), "--requests", str(path), "--max-tokens", "12", "--greedy"]
    ample = generate(base)
    assert ample.summary["prefix_cache_queries"] == 0
    specs = model_specs({name: tiny_dirs[name] for name in MODELS})
    page = page_bytes_for(specs, BLOCK_TOKENS)
    longest = max(-(-(len(p) + 12) // BLOCK_TOKENS) for p in work)
    budget = weight_bytes(specs, page) + len(MODELS) * (longest + 6) * page
    args = [*base, "--hbm-budget", str(budget), "--enable-prefix-caching"]
    cached = generate([*args, "--force-rotation"])
    assert cached.outputs == ample.outputs
    summary = cached.summary
    assert summary["prefix_cache_queries"] == sum(map(len, work))
    # Requests admitted in the step before their prefix is computed find nothing;
    # the later ones find both of its full blocks.
    assert summary["prefix_cache_hits"] >= 2 * 32 and summary["prefix_cache_hits"] % 16 == 0
    # A rotated request's shared prefix blocks still on the device are shared again
    # when it swaps back in, not copied in again.
    rotated = generate([*base, "--hbm-budget", str(budget), "--force-rotation"])
    assert rotated.outputs == ample.outputs
    assert summary["blocks_swapped_in"] < rotated.summary["blocks_swapped_in"]
    assert summary["rotations"] > 0
    assert generate(args).outputs == ample.outputs


def test_shared_prefixes_keep_their_tokens_with_layers_remapped(four_layers: Path) -> None:
    work = shared_prefix_prompts(6, prefix_len=36)
    lines: list[dict[str, object]] = [{"prompt_ids": p, "max_tokens": 6} for p in work]
    path = write_requests(four_layers.parent / "prefix.jsonl", lines)
    base = ["--model", str(four_layers), "--requests", str(path), "--max-tokens", "6", "--greedy"]
    plain = generate(base)
    specs = model_specs({"deep": four_layers})
    page = page_bytes_for(specs, BLOCK_TOKENS)
    budget = weight_bytes(specs, page) + 4 * page  # one request at a time
    tight = [*base, "--hbm-budget", str(budget), "--force-remap", "1", "--enable-prefix-caching"]
    cached = generate(tight)
    assert cached.outputs == plain.outputs
    assert cached.summary["prefix_cache_hits"] > 0
    assert cached.summary["layers_streamed"] > 0


def test_async_scheduling_keeps_the_tokens_with_rotation_remapping_and_prefix_caching(
    four_layers: Path,
) -> None:
    """``--async-scheduling``: each step planned while the one before runs, with every
    request rotated after each step, a layer streamed and prefixes shared: the tokens of
    the sequential loop."""
    work = shared_prefix_prompts(6, prefix_len=36)
    lines: list[dict[str, object]] = [{"prompt_ids": p, "max_tokens": 7} for p in work]
    path = write_requests(four_layers.parent / "async.jsonl", lines)
    base = ["--model", str(four_layers), "--requests", str(path), "--max-tokens", "7", "--greedy"]
    plain = generate(base)
    specs = model_specs({"deep": four_layers})
    page = page_bytes_for(specs, BLOCK_TOKENS)
    budget = weight_bytes(specs, page) + 6 * page
    tight = [*base, "--hbm-budget", str(budget), "--force-remap", "1", "--force-rotation"]
    pipelined = generate([*tight, "--enable-prefix-caching", "--async-scheduling"])
    assert pipelined.outputs == plain.outputs
    assert pipelined.summary["rotations"] > 0
    assert pipelined.summary["layers_streamed"] > 0
    assert pipelined.summary["prefix_cache_hits"] > 0


def test_forced_rotation_rotates_every_request_after_each_step_it_runs(
    tiny_dirs: dict[str, Path],
) -> None:
    base = [*model_args(tiny_dirs), "--prompt-ids", "5,6,7,8,9", "--max-tokens", "6", "--greedy"]
    plain = generate(base)
    forced = generate([*base, "--force-rotation"])
    assert forced.outputs == plain.outputs
    assert plain.summary["rotations"] == 0
    # Each request runs one step per trip: its prefill and 5 decodes, 5 trips between.
    assert forced.summary["rotations"] == len(MODELS) * 5
    assert forced.summary["steps"] > plain.summary["steps"]


def test_seeded_sampling_repeats_and_the_seed_matters(
    tiny_dirs: dict[str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    def sample(seed: str) -> list[object]:
        args = [*model_args(tiny_dirs), "--prompt-ids", "5,6,7", "--max-tokens", "12"]
        *outputs, _ = run_json([*args, "--temperature", "1.5", "--seed", seed], capsys)
        return [o["output_ids"] for o in outputs]

    assert sample("1") == sample("1")
    assert sample("1") != sample("2")


def test_text_output_lists_tokens_text_and_summary(
    tiny_dirs: dict[str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    args = ["generate", "--model", str(tiny_dirs["tiny-llama"]), "--prompt", "hi"]
    assert main([*args, "--max-tokens", "3", "--greedy"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("[0] tiny-llama: ")  # named after its directory
    assert out[1].startswith("    output_ids: ") and out[2].startswith("    text: ")
    assert out[-1].startswith("summary: rotations 0, ")


@pytest.fixture(scope="module")
def four_layers(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny model that can lend two of its four layers."""
    config = preset_config("tiny-llama") | {"num_hidden_layers": 4}
    return init_model_dir(tmp_path_factory.mktemp("deep") / "deep", config=config, seed=1)


def test_a_bare_force_remap_lends_every_layer_it_can(four_layers: Path) -> None:
    args = ["--model", str(four_layers), "--prompt-ids", "5,6,7,8", "--max-tokens", "5"]
    assert build_parser().parse_args(["generate", *args, "--force-remap"]).force_remap == (
        EVERY_LAYER
    )
    plain = generate([*args, "--greedy"])
    forced = generate([*args, "--greedy", "--force-remap"])
    assert forced.outputs == plain.outputs
    assert forced.summary["remapped_layers_max"] == 2  # four layers less two
    assert forced.summary["layers_streamed"] > 0
    assert forced.warnings == []


def test_force_remap_under_a_budget_remaps_without_the_remap_flag(four_layers: Path) -> None:
    base = ["--model", str(four_layers), "--prompt-ids", "5,6,7,8", "--max-tokens", "5"]
    plain = generate([*base, "--greedy"])
    specs = model_specs({"deep": four_layers})
    page = page_bytes_for(specs, BLOCK_TOKENS)
    budget = weight_bytes(specs, page) + 2 * page
    tight = generate([*base, "--greedy", "--hbm-budget", str(budget), "--force-remap", "1"])
    assert tight.outputs == plain.outputs
    assert tight.summary["remapped_layers_max"] == 1
    assert tight.summary["layers_streamed"] > 0


def test_force_remap_says_when_a_model_has_no_layer_to_lend(
    tiny_dirs: dict[str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    args = [*model_args(tiny_dirs), "--prompt-ids", "5,6,7", "--max-tokens", "3", "--greedy"]
    *_, summary = run_json([*args, "--force-remap"], capsys)
    counts = summary["summary"]
    assert isinstance(counts, dict)
    assert counts["remapped_layers_max"] == 0
    warnings = counts["warnings"]
    assert warnings == [
        f"--force-remap: model {name!r} lends no layer: it has 2 layers and a model lends "
        "at most its layers less 2"
        for name in MODELS
    ]
    assert main(["generate", *args, "--force-remap", "1"]) == 0
    captured = capsys.readouterr()
    assert captured.err.splitlines() == [f"shunter generate: warning: {w}" for w in warnings]
    assert captured.out.splitlines()[-1].startswith("summary: ")


@pytest.fixture(scope="module")
def sentencepiece_dir(tmp_path_factory: pytest.TempPathFactory, sentencepiece: Tokenizer) -> Path:
    """A tiny model whose tokenizer is SentencePiece-style, as Llama 2's and Mistral's."""
    out = init_model_dir(
        tmp_path_factory.mktemp("sp") / "sp", config=preset_config("tiny-mistral"), seed=2
    )
    sentencepiece.save(str(out / "tokenizer.json"))
    config = {"tokenizer_class": "LlamaTokenizerFast", "bos_token": "<s>", "eos_token": "</s>"}
    (out / "tokenizer_config.json").write_text(json.dumps(config))
    (out / "generation_config.json").write_text(json.dumps({"eos_token_id": 2}))
    # Random weights pick stray non-ASCII byte tokens, and invalid UTF-8 becomes U+FFFD
    # differently: the ByteFallback decoder replaces a whole run of byte tokens that
    # fails, a UTF-8 decoder only the invalid bytes. Zero logits for bytes 0x80-0xFF
    # keep greedy output valid, so that it can be compared with decode.
    weights = load_file(out / "model.safetensors")
    weights["lm_head.weight"][3 + 0x80 : 3 + 0x100] = 0
    save_file(weights, out / "model.safetensors", metadata={"format": "pt"})
    return out


def test_sentencepiece_text_continues_the_prompt(
    sentencepiece_dir: Path, sentencepiece: Tokenizer, capsys: pytest.CaptureFixture[str]
) -> None:
    text = "Le train arrive à Zürich 🚂\n"
    args = ["--model", str(sentencepiece_dir), "--prompt", text, "--max-tokens", "24"]
    [out, _] = run_json([*args, "--greedy"], capsys)
    prompt_ids, output_ids = out["prompt_ids"], out["output_ids"]
    assert isinstance(prompt_ids, list) and isinstance(output_ids, list)
    assert prompt_ids == sentencepiece.encode(text).ids
    assert sentencepiece.decode(prompt_ids) == text
    # The text is what the output tokens add to the prompt's decoded text.
    ids = [t for t in output_ids if t != 2]
    whole = sentencepiece.decode(prompt_ids + ids)
    assert out["text"] == whole[len(text) :]
    assert out["text"]


def test_a_tokenizer_the_engine_cannot_detokenize_is_refused_in_one_line(
    tmp_path: Path, tiny_dirs: dict[str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    model = shutil.copytree(tiny_dirs["tiny-llama"], tmp_path / "wordpiece")
    tokenizer = Tokenizer(models.WordPiece({"[UNK]": 0, "a": 1}, unk_token="[UNK]"))
    tokenizer.decoder = decoders.WordPiece()
    tokenizer.save(str(model / "tokenizer.json"))
    args = ["generate", "--model", str(model), "--prompt-ids", "1", "--max-tokens", "2"]
    assert main(args) == 2
    err = capsys.readouterr().err.splitlines()
    assert err == [
        f"shunter generate: error: model 'wordpiece': {model}/tokenizer.json: unsupported "
        "tokenizer: decoder ['WordPiece'] is neither ByteLevel (byte-level BPE) nor "
        "SentencePiece-style (Metaspace or Replace ▁ by a space, ByteFallback)"
    ]
    (model / "tokenizer.json").write_text("{not json")
    assert main(args) == 2
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and f"{model}/tokenizer.json cannot be read: " in err[0]


ERRORS = [
    ("missing-dir", "directory {tmp}/nowhere does not exist"),
    ("unknown-model", "requests.jsonl:2: unknown model 'gpt'; --model gives tiny-llama"),
    ("bad-json", "requests.jsonl:3: not valid JSON"),
    ("no-prompt", "requests.jsonl:1: give exactly one of prompt_ids and prompt"),
    ("weights-too-big", "--hbm-budget 65536 is too small for the weights"),
    ("request-too-big", "is too small to hold request #0: it needs 5 KV blocks"),
    ("seed-with-greedy", "--seed applies to sampling"),
    ("token-out-of-range", "token id 9999 is outside the vocabulary"),
]


@pytest.mark.parametrize(("case", "message"), ERRORS, ids=[case for case, _ in ERRORS])
def test_bad_input_gets_a_clear_error_not_a_traceback(
    case: str,
    message: str,
    tmp_path: Path,
    tiny_dirs: dict[str, Path],
    capsys: pytest.CaptureFixture[str],
) -> None:
    llama = str(tiny_dirs["tiny-llama"])
    good = '{"prompt_ids": [1, 2]}\n'
    files = {
        "unknown-model": good + '{"model": "gpt", "prompt_ids": [1]}\n',
        "bad-json": good + "\n" + '{"prompt_ids": [1, 2}\n',
        "no-prompt": '{"max_tokens": 3}\n',
    }
    requests = write_requests(tmp_path / "requests.jsonl", [])
    requests.write_text(files.get(case, good))
    specs = model_specs({"tiny-llama": tiny_dirs["tiny-llama"]})
    page = page_bytes_for(specs, BLOCK_TOKENS)
    # Room for the weights and 4 blocks of KV; the request needs 5 (2 + 70 tokens).
    small = weight_bytes(specs, page) + 4 * page
    args = {
        "missing-dir": ["--model", str(tmp_path / "nowhere"), "--prompt-ids", "1"],
        "unknown-model": ["--model", llama, "--requests", str(requests)],
        "bad-json": ["--model", llama, "--requests", str(requests)],
        "no-prompt": ["--model", llama, "--requests", str(requests)],
        "weights-too-big": ["--model", llama, "--prompt-ids", "1", "--hbm-budget", "64K"],
        "request-too-big": ["--model", llama, "--prompt-ids", "1,2", "--hbm-budget", str(small)],
        "seed-with-greedy": ["--model", llama, "--prompt-ids", "1", "--greedy", "--seed", "3"],
        "token-out-of-range": ["--model", llama, "--prompt-ids", "1,9999"],
    }[case]
    max_tokens = "70" if case == "request-too-big" else "2"
    assert main(["generate", *args, "--max-tokens", max_tokens]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.startswith("shunter generate: error: ")
    assert message.format(tmp=tmp_path) in captured.err
    assert "Traceback" not in captured.err


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
def test_asking_for_cuda_without_one_is_an_error(
    tiny_dirs: dict[str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    args = ["--model", str(tiny_dirs["tiny-llama"]), "--prompt-ids", "1", "--max-tokens", "2"]
    assert main(["generate", *args, "--device", "cuda"]) == 2
    assert "no CUDA device is available" in capsys.readouterr().err


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_rotation_on_cuda_keeps_the_tokens_of_an_ample_run(
    tmp_path: Path, tiny_dirs: dict[str, Path]
) -> None:
    lines: list[dict[str, object]] = [
        {"model": MODELS[i % 2], "prompt_ids": p, "max_tokens": 16}
        for i, p in enumerate(prompts(8, seed=5))
    ]
    path = write_requests(tmp_path / "requests.jsonl", lines)
    base = [*model_args(tiny_dirs), "--requests", str(path), "--max-tokens", "16", "--greedy"]
    ample = generate([*base, "--device", "cuda"])
    specs = model_specs({name: tiny_dirs[name] for name in MODELS})
    page = page_bytes_for(specs, BLOCK_TOKENS)
    budget = weight_bytes(specs, page) + len(MODELS) * 5 * page
    cuda = generate([*base, "--device", "cuda", "--hbm-budget", str(budget), "--force-rotation"])
    assert cuda.outputs == ample.outputs
    assert cuda.summary["rotations"] > 0
