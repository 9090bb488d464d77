"""An engine ``/admin/state`` snapshot in the shape ``engine.server.state.engine_state``
returns (the browser test and test_memory_map also read real ones): a temporal model
``llama`` holding the turn with two layers lent to the KV cache, and a spatial ``qwen``."""

from __future__ import annotations

from typing import Any

PAGE = 8192


def engine_like_state() -> dict[str, Any]:
    pages = {"free": 120, "kv:llama": 40, "kv:qwen": 90, "weights:llama": 70, "weights:qwen": 63}
    return {
        "models": {
            "llama": {
                "sharing": "temporal",
                "priority": 0,
                "kv_floor": None,
                "kv_ceiling": None,
                "max_context": None,
                "share_prefixes": False,
                "active": True,
                "kv_blocks_used": 30,
                "kv_blocks_total": 64,
                "kv_usage": 30 / 64,
                "weight_bytes_resident": 70 * PAGE,
                "remapped_layers": [1, 3],
                "weight_bytes_remapped": 9 * PAGE,
                "requests": {"waiting": 2, "running": 4, "rotary": 1},
                "host_swap_blocks_used": 6,
                "prefix_queries": 4000,
                "prefix_hits": 2480,
                "prefix_host_hits": 450,
                "prefix_cached_blocks": 12,
                "prefix_host_cached_blocks": 40,
            },
            "qwen": {
                "sharing": "spatial",
                "priority": 1,
                "kv_floor": 64 * PAGE,
                "kv_ceiling": None,
                "max_context": 1024,
                "share_prefixes": True,
                "active": True,
                "kv_blocks_used": 80,
                "kv_blocks_total": 128,
                "kv_usage": 80 / 128,
                "weight_bytes_resident": 63 * PAGE,
                "remapped_layers": [],
                "weight_bytes_remapped": 0,
                "requests": {"waiting": 0, "running": 5, "rotary": 0},
                "host_swap_blocks_used": 0,
            },
        },
        "arena": {
            "page_bytes": PAGE,
            "num_pages": sum(pages.values()),
            "pages_by_owner": pages,
        },
        "host_swap": {"bytes_used": 6 * 4096, "bytes_total": 2 * 1024 * 1024},
        "tenancy": {
            "turn_holder": "llama",
            "temporal": ["llama"],
            "spatial": ["qwen"],
            "turn_switches": 3,
        },
        "requests": {"live": 12, "streams": 12},
        "transfers": {
            "rotations": 10,
            "preemptions": 10,
            "blocks_d2h": 40,
            "blocks_h2d": 34,
            "bytes_d2h": 40 * 4096,
            "bytes_h2d": 34 * 4096,
            "remapped_layers_now": 2,
            "steps_in_flight": 0,
        },
        "steps": {
            "total": 500,
            "recent_duration_s": [0.001 + 0.0001 * (i % 5) for i in range(64)],
            "recent_schedule_s": [0.0001] * 64,
            "token_budget": 256,
        },
        "t_snapshot": 1_700_000_000.0,
        "snapshot_age_s": 0.01,
        "stalled": False,
        "draining": False,
        "reconciling": False,
    }
