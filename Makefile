# Thin targets over scripts/. The README's two commands: `make demo` and `make test`.
VENV ?= .venv
export VENV

.PHONY: install demo test lint typecheck bench sim clean

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

clean:
	rm -rf build dist *.egg-info var/typecheck .pytest_cache .mypy_cache .ruff_cache
