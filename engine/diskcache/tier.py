"""One rank's disk tier (stand-in: mlx-lm's prompt cache files, a JSON header and a sha256 beside; written on the
calling thread, no cap)."""

from __future__ import annotations

import hashlib
import json
import logging
import os
from pathlib import Path

from mlx_lm.models.cache import load_prompt_cache, save_prompt_cache

log = logging.getLogger(__name__)


class DiskTier:
    def __init__(self, folder, cap_bytes: int) -> None:
        self.folder = Path(folder)
        self.folder.mkdir(parents=True, exist_ok=True, mode=0o700)
        self.cap = cap_bytes

    def _paths(self, name: str) -> tuple[Path, Path]:
        return self.folder / f"{name}.safetensors", self.folder / f"{name}.json"

    def put(self, name: str, layers: list, header: dict) -> None:
        kv, meta = self._paths(name)
        save_prompt_cache(str(kv), layers)
        digest = hashlib.sha256(kv.read_bytes()).hexdigest()
        tmp = meta.with_suffix(".tmp")
        tmp.write_text(json.dumps({**header, "sha256": digest}))
        os.replace(tmp, meta)

    def load(self, name: str) -> list | None:
        kv, meta = self._paths(name)
        try:
            header = json.loads(meta.read_text())
            if hashlib.sha256(kv.read_bytes()).hexdigest() != header["sha256"]:
                raise ValueError("checksum mismatch")
            return load_prompt_cache(str(kv))
        except FileNotFoundError:
            return None
        except Exception as exc:
            log.warning("disk entry %s is damaged (%s); deleting it", name, exc)
            self.delete(name)
            return None

    def delete(self, name: str) -> None:
        for p in self._paths(name):
            p.unlink(missing_ok=True)

    def scan(self):
        for meta in self.folder.glob("*.json"):
            try:
                yield meta.stem, json.loads(meta.read_text())
            except Exception:
                continue

    def stats(self) -> dict:
        files = list(self.folder.glob("*.safetensors"))
        return {"entries": len(files), "bytes": sum(f.stat().st_size for f in files), "cap_bytes": self.cap}

    def flush(self) -> None:
        pass

    def close(self) -> None:
        pass
