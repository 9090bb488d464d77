"""The executor tests' tiny model directories, SentencePiece-style tokenizer and one torch
thread, for offline generation."""

from tests.engine.exec.conftest import one_thread, sentencepiece, tiny_dirs

__all__ = ["one_thread", "sentencepiece", "tiny_dirs"]
