#!/usr/bin/env bash
# `make bench`: the engine's benchmarks. Scheduler figures are host time on this machine.
set -euo pipefail
cd "$(dirname "$0")/.."

echo "== scheduler: median step planning time, LVF vs FCFS"
"${VENV:-.venv}/bin/shunter" bench scheduler

echo "== remap: median step planning time, 8 tenants, 1,024 live requests, remapping on"
"${VENV:-.venv}/bin/shunter" bench remap

echo "== simulator: simulated seconds per wall second (SIMULATED workload)"
"${VENV:-.venv}/bin/shunter" bench simulator

echo "== executor (CPU, small-llama): engine vs transformers tokens/s; KV rotation step cost"
"${VENV:-.venv}/bin/shunter" bench executor

echo "== server (CPU, tiny-llama): TTFT and ITL through the HTTP server vs in-process, 1 and 32 streams"
"${VENV:-.venv}/bin/shunter" bench server

echo "== prefix caching (CPU, tiny-llama, 8k context): document-QA and multi-turn chat TTFT, cache on vs off"
"${VENV:-.venv}/bin/shunter" bench prefix

echo "== executor remapping (CPU, small-llama): decode step with layers streamed vs none"
"${VENV:-.venv}/bin/shunter" bench remap-exec

echo "== async scheduling (CPU, tiny-llama, batch 32): decode steps/s pipelined vs sequential, alone and beside a CPU hog"
"${VENV:-.venv}/bin/shunter" bench pipeline

echo "== gateway (CPU, tiny-llama; PostgreSQL and Redis): TTFT and ITL through the gateway vs straight to the engine"
"${VENV:-.venv}/bin/shunter" bench gateway

echo "== gateway failover (CPU, 2x tiny-llama): steady load with one of two engines killed mid-run vs none"
"${VENV:-.venv}/bin/shunter" bench gateway --replicas 2

echo "== load generator: 200 req/s open loop against a local SSE fixture (64 tokens), send rate and timing error"
"${VENV:-.venv}/bin/shunter" bench loadgen

echo "== isolation (CPU, 2x tiny-llama, 2 ms step target): a quiet tenant's TTFT alone vs beside 2,047-token prompts and max fan-out"
"${VENV:-.venv}/bin/shunter" bench isolation --step-target-ms 2 --requests 200

echo "== isolation, SIMULATED (GH200, scenario c1, every variant, the engine's 25 ms step target): a victim tenant's P99 TTFT alone vs beside a 10x batch aggressor"
"${VENV:-.venv}/bin/shunter" bench isolation --on sim --scenario c1 --variants vllm,lvf,lvf+,oneiros,combined,combined+

echo "== isolation, SIMULATED (GH200, scenario c2, every variant but Algorithm 1's, whose rotation costs the victim its TBT: --scenario c2 alone, docs/engine.md)"
"${VENV:-.venv}/bin/shunter" bench isolation --on sim --scenario c2 --variants vllm,lvf+,oneiros,combined+
