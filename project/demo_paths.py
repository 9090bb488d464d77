"""Where ``shunter demo`` keeps its files: the models it makes, the tenants' keys and its
children's logs, all under the platform's ``VAR_DIR``."""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass
from pathlib import Path

KEYS_FILE = "keys.json"


@dataclass(frozen=True)
class DemoPaths:
    """Where the demo keeps its files, under the platform's ``VAR_DIR``."""

    var_dir: Path

    @property
    def models(self) -> Path:
        return self.var_dir / "models"

    @property
    def demo(self) -> Path:
        return self.var_dir / "demo"

    @property
    def keys(self) -> Path:
        return self.demo / KEYS_FILE

    @property
    def engine_log(self) -> Path:
        return self.demo / "engine.log"

    @property
    def load_log(self) -> Path:
        return self.demo / "load.log"


def write_private(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` readable by its owner only (0600 from creation on, then
    renamed over the old file, so no other user ever sees it)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(f".{path.name}.partial")
    with contextlib.suppress(FileNotFoundError):
        partial.unlink()
    fd = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as out:
        out.write(text)
    partial.replace(path)
