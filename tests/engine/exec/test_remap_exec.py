"""Parameter remapping on real models: lent frames hold KV, layers stream through slots
and come back, and the tokens never change."""

from __future__ import annotations

import contextlib
import dataclasses
import json
from collections.abc import Sequence
from pathlib import Path

import pytest
import torch

from shunter.engine.checkpoint.random_weights import init_model_dir, preset_config
from shunter.engine.config import EngineConfig, RemapConfig, SchedulerConfig, TenantSpec
from shunter.engine.exec.forced_remap import ForcedRemap
from shunter.engine.exec.params import SamplingParams
from shunter.engine.exec.serving import TorchEngine, model_specs
from shunter.engine.exec.sizing import (
    BLOCK_TOKENS,
    KVNeed,
    page_bytes_for,
    serving_config,
    weight_bytes,
)
from shunter.engine.memory.arena import FREE
from shunter.engine.request import RequestState
from shunter.project.cli import main
from tests.engine.exec.conftest import CPU, NUM_LAYERS

GREEDY = SamplingParams(temperature=0.0)


def work(
    count: int, seed: int, models: tuple[str, str] = ("tiny-llama", "tiny-qwen2")
) -> list[tuple[str, list[int], int]]:
    gen = torch.Generator().manual_seed(seed)
    out = []
    for i in range(count):
        n = int(torch.randint(3, 40, (1,), generator=gen))
        prompt = torch.randint(4, 500, (n,), generator=gen).tolist()
        out.append((models[i % 2], prompt, 12 + i % 5))
    return out


def config_for(
    dirs: dict[str, Path],
    requests: Sequence[tuple[str, list[int], int]],
    *,
    kv_pages: int | None = None,
    remap: bool = False,
    force_rotation: bool = False,
) -> EngineConfig:
    """The serving config; with ``kv_pages``, an arena of the weights and that many
    pages of KV per model."""
    specs = model_specs(dirs)
    needs = [KVNeed(str(i), m, len(p) + n) for i, (m, p, n) in enumerate(requests)]
    budget = None
    if kv_pages is not None:
        page = page_bytes_for(specs, BLOCK_TOKENS)
        budget = weight_bytes(specs, page) + len(specs) * kv_pages * page
    return serving_config(
        specs,
        needs,
        hbm_budget=budget,
        force_rotation=force_rotation,
        remap=remap,
        check_integrity=True,
    )


def run(engine: TorchEngine, requests: Sequence[tuple[str, list[int], int]]) -> list[list[int]]:
    """Every request's greedy tokens; after each step, the executor reads each layer
    from where the remapper put it."""
    ids = [
        engine.add_request(m, p, dataclasses.replace(GREEDY, max_tokens=n)) for m, p, n in requests
    ]
    done = {}
    while not engine.core.is_idle():
        done.update((o.request_id, o) for o in engine.step())
        assert_frames_agree(engine)
    return [done[i].output_ids for i in ids]


def assert_frames_agree(engine: TorchEngine) -> None:
    remapper = engine.core.remapper
    if remapper is None:
        return
    for name, served in engine.executor.models.items():
        assert served.frames is not None
        wmap = remapper.maps[name]
        frame_of = served.frames.frame_of
        # Layers that started streaming while their model did not run keep their
        # frames until its next pass; every other layer is where the remapper put it.
        stale = {layer: frame_of[layer] for layer in set(frame_of) - set(wmap.frame_of)}
        assert set(stale) <= set(wmap.layout.streamed)
        assert {layer: frame_of[layer] for layer in wmap.frame_of} == dict(wmap.frame_of)
        assert served.frames.lent == set(wmap.reclaimed)


def test_forced_remapping_streams_layers_and_keeps_every_token(
    deep_dirs: dict[str, Path],
) -> None:
    requests = work(8, seed=1)
    plain = TorchEngine(deep_dirs, config_for(deep_dirs, requests), device=CPU)
    expected = run(plain, requests)
    assert plain.totals.layers_streamed == 0

    forced = TorchEngine(
        deep_dirs, config_for(deep_dirs, requests, remap=True), device=CPU, force_remap=2
    )
    assert run(forced, requests) == expected
    assert forced.core.remapper is not None
    assert forced.core.remapper.alpha() == {"tiny-llama": 2, "tiny-qwen2": 2}
    # Two lent layers stream through one or two slots: 3 or 4 copies a pass, and
    # every step runs one or two passes.
    steps = forced.totals.steps
    assert 3 * steps <= forced.totals.layers_streamed <= 2 * 4 * steps
    assert forced.totals.remapped_layers_max == 4


def test_layouts_changing_every_few_steps_keep_every_token(deep_dirs: dict[str, Path]) -> None:
    """Lent counts up and down while requests decode: layers start and stop streaming,
    frames pass between layers, slots and the KV cache, and nothing shows in the tokens."""
    requests = [(m, p, 40) for m, p, _ in work(6, seed=5)]
    expected = run(TorchEngine(deep_dirs, config_for(deep_dirs, requests), device=CPU), requests)
    # Cap 0: the controller lends exactly the forced count, and gives back the rest.
    config = dataclasses.replace(
        config_for(deep_dirs, requests), remap=RemapConfig(enabled=True, cap_fraction=0.0)
    )
    engine = TorchEngine(deep_dirs, config, device=CPU, force_remap=2)
    remapper = engine.core.remapper
    assert remapper is not None and isinstance(remapper.controller, ForcedRemap)
    controller = remapper.controller
    counts = iter([2, 3, 2, 0, 4, 3, 5, 3, 6, 5, 1] * 3)
    ids = [
        engine.add_request(m, p, dataclasses.replace(GREEDY, max_tokens=n)) for m, p, n in requests
    ]
    done = {}
    seen = set()
    while not engine.core.is_idle():
        if engine.totals.steps % 2 == 0:
            controller.layers = next(counts, 0)
        done.update((o.request_id, o) for o in engine.step())
        assert_frames_agree(engine)
        seen.add(remapper.alpha()["tiny-llama"])
    assert [done[i].output_ids for i in ids] == expected
    assert set(range(7)) <= seen
    assert engine.totals.layers_restored > 0


def test_remapping_rotation_and_a_tight_arena_keep_every_token(
    deep_dirs: dict[str, Path],
) -> None:
    """One temporal and one spatial model, forced rotation and forced remapping, an
    arena that holds a few requests of each: the tokens of a run with room for all."""
    requests = work(12, seed=2)
    expected = run(TorchEngine(deep_dirs, config_for(deep_dirs, requests), device=CPU), requests)

    longest = max(-(-(len(p) + n) // BLOCK_TOKENS) for _, p, n in requests)
    tight = config_for(deep_dirs, requests, kv_pages=longest + 1, remap=True, force_rotation=True)
    tight = dataclasses.replace(
        tight,
        tenants=(TenantSpec("tiny-llama", sharing="temporal"), TenantSpec("tiny-qwen2")),
        scheduler=SchedulerConfig(turn_quantum_s=0.0),
    )
    engine = TorchEngine(deep_dirs, tight, device=CPU, force_rotation=True, force_remap=2)
    assert run(engine, requests) == expected
    assert engine.totals.rotations > 0
    assert engine.totals.layers_streamed > 0
    # At least the forced layers; the pressure takes more.
    assert engine.totals.remapped_layers_max >= 4


@pytest.mark.parametrize("preset", ["tiny-qwen3", "tiny-mixtral", "tiny-qwen3-moe"])
def test_qwen3_and_moe_models_under_rotation_and_remapping_keep_every_token(
    preset: str, tmp_path: Path
) -> None:
    """Qwen3's q/k norms and Mixtral's router and experts travel with their layers:
    streamed into slots, lent and restored, the KV rotated, and the greedy tokens those
    of a run with room for all."""
    dirs = {}
    for name in ("tiny-llama", preset):
        config = preset_config(name) | {"num_hidden_layers": NUM_LAYERS}
        dirs[name] = init_model_dir(tmp_path / name, config=config, seed=3)
    requests = work(10, seed=6, models=("tiny-llama", preset))
    expected = run(TorchEngine(dirs, config_for(dirs, requests), device=CPU), requests)

    longest = max(-(-(len(p) + n) // BLOCK_TOKENS) for _, p, n in requests)
    tight = config_for(dirs, requests, kv_pages=longest + 1, remap=True, force_rotation=True)
    tight = dataclasses.replace(
        tight,
        tenants=(TenantSpec(preset, sharing="temporal"), TenantSpec("tiny-llama")),
        scheduler=SchedulerConfig(turn_quantum_s=0.0),
    )
    engine = TorchEngine(dirs, tight, device=CPU, force_rotation=True, force_remap=2)
    assert run(engine, requests) == expected
    assert engine.totals.rotations > 0
    assert engine.totals.layers_streamed > 0
    arch = engine.executor.models[preset].model.arch
    assert arch.qk_norm or arch.num_experts == 4


def test_kv_lands_in_lent_frames_and_the_weights_come_back_bit_exact(
    deep_dirs: dict[str, Path],
) -> None:
    requests = work(10, seed=4)
    expected = run(TorchEngine(deep_dirs, config_for(deep_dirs, requests), device=CPU), requests)
    # So little KV that the lent frames must hold some.
    config = config_for(deep_dirs, requests, kv_pages=4, remap=True)
    engine = TorchEngine(deep_dirs, config, device=CPU, force_remap=2)
    memory, arena = engine.core.memory, engine.arena
    base = arena.data.data_ptr()
    ids = [
        engine.add_request(m, p, dataclasses.replace(GREEDY, max_tokens=n)) for m, p, n in requests
    ]
    done = {}
    in_lent: set[tuple[str, int]] = set()
    while not engine.core.is_idle():
        done.update((o.request_id, o) for o in engine.step())
        assert_frames_agree(engine)
        for name, served in engine.executor.models.items():
            assert served.frames is not None
            for frame in served.frames.lent:
                pages = memory.frame_pages(name, frame)
                lo, hi = pages.start * arena.page_bytes, pages.stop * arena.page_bytes
                for rid in engine.core.scheduler.requests:
                    r = engine.core.scheduler.requests[rid]
                    if r.state is not RequestState.RUNNING or not memory.is_resident(r):
                        continue
                    kv = engine.executor.models[r.model].kv_cache
                    for block in memory.block_ids(rid):
                        start = kv[block].data_ptr() - base
                        if lo <= start and start + kv[block].nbytes <= hi:
                            # The block's bytes are KV: no layer's weights are there. A
                            # frame pads its layer's bytes by less than a block, so every
                            # block inside a frame covers some of them.
                            packed = engine.packed[name].data
                            at = slice(
                                start - lo, min(start - lo + kv[block].nbytes, packed.shape[1])
                            )
                            assert at.start < at.stop, (at, packed.shape)
                            held = arena.data[start : start + at.stop - at.start]
                            assert not any(torch.equal(held, w[at]) for w in packed)
                            in_lent.add((name, frame))
    assert [done[i].output_ids for i in ids] == expected
    assert in_lent, "no KV block ever sat in a lent frame"

    # Stop forcing: idle steps revert every layer, and the weights are the host's.
    remapper = engine.core.remapper
    assert remapper is not None and isinstance(remapper.controller, ForcedRemap)
    remapper.controller.layers = 0
    for _ in range(20):
        engine.step()
        if not any(remapper.alpha().values()) and not remapper.is_vacating:
            break
    assert remapper.alpha() == {"tiny-llama": 0, "tiny-qwen2": 0}
    assert engine.totals.layers_restored >= 4
    for name, served in engine.executor.models.items():
        assert served.frames is not None
        assert not served.frames.lent
        for layer, frame in served.frames.frame_of.items():
            assert torch.equal(served.frames.frames[frame], engine.packed[name].data[layer])
            owners = {memory.arena.owner(p) for p in memory.frame_pages(name, frame)}
            assert FREE not in owners
    # And a second run on the restored weights gives the same tokens.
    assert run(engine, requests) == expected


def test_generate_force_remap_reports_streamed_layers(
    deep_dirs: dict[str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    models = [arg for name, path in deep_dirs.items() for arg in ("--model", f"{name}={path}")]
    base = ["generate", *models, "--prompt-ids", "5,6,7,8,9", "--max-tokens", "6", "--greedy"]

    def summary_and_outputs(*extra: str) -> tuple[dict[str, int], list[str]]:
        assert main([*base, "--json", *extra]) == 0
        *outputs, last = capsys.readouterr().out.splitlines()
        return json.loads(last)["summary"], outputs

    plain, expected = summary_and_outputs()
    assert plain["layers_streamed"] == plain["layers_restored"] == 0
    assert plain["remapped_layers_max"] == 0
    forced, outputs = summary_and_outputs("--force-remap", "3")
    assert outputs == expected
    assert forced["remapped_layers_max"] == 6
    assert forced["layers_streamed"] >= 4 * 6  # 3 lent + a slot, 6 tokens of each model
    # No model is inactive here (both spatial): nothing is forced.
    inactive, outputs = summary_and_outputs("--force-remap", "3", "--force-remap-inactive")
    assert outputs == expected
    assert inactive["layers_streamed"] == 0


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--force-remap-inactive"], "--force-remap-inactive applies to --force-remap N"),
        (["--force-remap", "-1"], "expected an integer >= 0"),
    ],
)
def test_bad_remap_flags_get_a_clear_error(
    args: list[str], message: str, deep_dirs: dict[str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    model = ["--model", str(deep_dirs["tiny-llama"])]
    with contextlib.suppress(SystemExit):  # argparse exits 2 on bad values
        assert main(["generate", *model, "--prompt-ids", "1", "--max-tokens", "2", *args]) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_remapping_on_cuda_keeps_every_token(deep_dirs: dict[str, Path]) -> None:
    cuda = torch.device("cuda")
    requests = work(8, seed=6)
    expected = run(TorchEngine(deep_dirs, config_for(deep_dirs, requests), device=cuda), requests)
    longest = max(-(-(len(p) + n) // BLOCK_TOKENS) for _, p, n in requests)
    config = config_for(deep_dirs, requests, kv_pages=longest + 1, remap=True, force_rotation=True)
    engine = TorchEngine(deep_dirs, config, device=cuda, force_rotation=True, force_remap=2)
    assert run(engine, requests) == expected
    assert engine.totals.layers_streamed > 0 and engine.totals.rotations > 0
    remapper = engine.core.remapper
    assert remapper is not None and isinstance(remapper.controller, ForcedRemap)
    remapper.controller.layers = 0
    for _ in range(20):
        engine.step()
    assert remapper.alpha() == {"tiny-llama": 0, "tiny-qwen2": 0}
    for name, served in engine.executor.models.items():
        assert served.frames is not None
        for layer, frame in served.frames.frame_of.items():
            host = engine.packed[name].data[layer]
            assert torch.equal(served.frames.frames[frame].cpu(), host)
