# Thin targets over scripts/. The README's two commands: `make demo` and `make test`.
VENV ?= .venv
export VENV

.PHONY: install demo test lint typecheck bench bench-check gpu-check gpu-wheels sim clean

install:
	@bash scripts/install.sh

demo: install
	@bash scripts/demo.sh

test: install
	@bash scripts/test.sh

lint: install
	@$(VENV)/bin/ruff check .

typecheck: install
	@bash scripts/typecheck.sh

bench: install
	@bash scripts/bench.sh

# The same benchmarks held to their targets within stated noise margins; fails on a miss.
bench-check: install
	@bash scripts/bench_check.sh

# On a CUDA machine: every CUDA test, the kernel benchmarks, a calibration and the executor
# benchmarks on the device, in one report folder (var/gpu-check). Installs nothing from a
# registry; `make gpu-wheels` (here) puts the pure-Python test imports in .whl/ to carry.
gpu-check:
	@bash scripts/gpu_check.sh

gpu-wheels:
	@python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
	  --implementation cp -d .whl "django>=5.2,<5.3" asgiref sqlparse "llguidance>=1.0"

# A SIMULATED comparison of the four policies on the paper's setting (Qwen2.5-32B, GH200).
sim: install
	@$(VENV)/bin/shunter simulate --model qwen2.5-32b --hardware gh200 --policy lvf,fcfs,wf,sf \
		--rps 8,16,24,32 --duration 120 --ttft-slo 5 --tbt-slo 0.1 \
		--json var/sim.json --plot var/sim.html

clean:
	rm -rf build dist *.egg-info var/typecheck .pytest_cache .mypy_cache .ruff_cache
