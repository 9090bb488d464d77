"""Where ``shunter demo`` keeps its files: the models it makes, the tenants' keys and its
children's logs, all under the platform's ``VAR_DIR``."""

from __future__ import annotations

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
