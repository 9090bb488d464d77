"""The executor tests' tiny model directories and one torch thread, for model init."""

from tests.engine.exec.conftest import one_thread, tiny_dirs

__all__ = ["one_thread", "tiny_dirs"]
