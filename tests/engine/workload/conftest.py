"""The tiny model whose tokenizer measures request lengths, shared with the load
generator's tests."""

from tests.engine.loadgen.conftest import tiny_llama  # noqa: F401 (a fixture)
