"""Can mlx-lm load this model folder? What its files alone tell, in one sentence, without MLX.

Standard library only and self-contained: ops/hostprobe.py runs this file with runpy on every host
(where the project may be broken), `launch.sh start` runs it before starting the engine, and every
engine rank runs it before loading, so all of them say the same sentence about the same file.
"""

from __future__ import annotations

import ast
import importlib.metadata
import importlib.util
import json
from pathlib import Path

CONFIG = "config.json"
WEIGHTS = "model*.safetensors"  # what mlx_lm.utils.load_model loads; other names it ignores
INDEX = "model.safetensors.index.json"
# One of these holds the vocabulary (fast, sentencepiece, byte-level BPE, tiktoken).
VOCABULARIES = ("tokenizer.json", "tokenizer.model", "vocab.json", "tiktoken.model")
# The tokenizer's JSON files; transformers fails on any that does not parse.
TOKENIZER_JSON = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "added_tokens.json",
                  "chat_template.json")
FOREIGN_WEIGHTS = ("*.bin", "*.pt", "*.pth", "*.gguf", "*.npz")
HEADER_LIMIT = 100_000_000  # bytes: the safetensors format's own bound on a header
AGAIN = "download or copy the model again"


def folder_problem(folder: Path) -> str | None:
    """One sentence naming the file and what is wrong with it (and what to do), or None when it looks loadable."""
    folder = Path(folder)
    if not folder.is_dir():
        return f"{folder} is not a folder: set MODEL to an MLX model folder (as mlx_lm.convert writes) or a repo id"
    config, problem = read_json(folder / CONFIG)
    if problem:
        return f"{problem}: restore the {CONFIG} that came with the model"
    return (config_problem(folder, config) or weights_problem(folder) or tokenizer_problem(folder))


def read_json(path: Path) -> tuple[object, str | None]:
    """(the parsed document, None), or (None, what is wrong with the file)."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return None, f"{path} is missing"
    except UnicodeDecodeError:
        return None, f"{path} is not text (not UTF-8), so not JSON"
    except OSError as exc:
        return None, f"{path} cannot be read ({exc.strerror or exc})"
    try:
        return json.loads(text), None
    except json.JSONDecodeError as exc:
        return None, f"{path} is not valid JSON ({exc.msg} at line {exc.lineno}, column {exc.colno})"


def config_problem(folder: Path, config: object) -> str | None:
    path = folder / CONFIG
    if not isinstance(config, dict):
        return (f"{path} holds a JSON {type(config).__name__}, not an object: restore the {CONFIG} that came with "
                "the model")
    model_type = config.get("model_type")
    if not isinstance(model_type, str) or not model_type:
        return (f"{path} has no model_type, so mlx-lm cannot tell which architecture to build: restore the "
                f"{CONFIG} that came with the model")
    if "model_file" in config:
        return None  # a custom architecture file: mlx-lm says itself what it makes of it
    known = mlx_lm_architectures()
    if known is None:
        return None  # no mlx-lm here (the probe reports that), or one laid out unlike 0.32: let it judge
    models, remapping, by_architecture = known
    resolved = architecture(config, remapping, by_architecture)
    if (models / f"{resolved}.py").is_file() or (models / resolved / "__init__.py").is_file():
        return None
    aka = f" (read as {resolved!r})" if resolved != model_type else ""
    return (f"{path} names model_type {model_type!r}{aka}, which mlx-lm {_version()} cannot build (no "
            f"mlx_lm/models/{resolved}.py): serve a model of an architecture mlx-lm supports, or upgrade mlx-lm "
            "if a newer release adds this one")


def architecture(config: dict, remapping: dict, by_architecture: dict) -> str:
    """The mlx_lm.models module mlx-lm picks for a config (as mlx_lm.utils._get_classes does)."""
    model_type = config["model_type"]
    archs = config.get("architectures") or ()
    for arch in (archs,) if isinstance(archs, str) else archs:
        if (model_type, arch) in by_architecture:
            return by_architecture[(model_type, arch)]
    return remapping.get(model_type, model_type)


def mlx_lm_architectures() -> tuple[Path, dict, dict] | None:
    """(the mlx_lm/models folder, MODEL_REMAPPING, MODEL_ARCHITECTURE_REMAPPING), read without importing mlx-lm."""
    try:
        spec = importlib.util.find_spec("mlx_lm")
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    root = Path(list(spec.submodule_search_locations)[0])
    try:
        tree = ast.parse((root / "utils.py").read_text(encoding="utf-8"))
    except (OSError, SyntaxError, UnicodeDecodeError):
        return None
    tables: dict[str, dict] = {}
    for node in tree.body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            name = node.targets[0].id
            if name in ("MODEL_REMAPPING", "MODEL_ARCHITECTURE_REMAPPING"):
                try:
                    tables[name] = ast.literal_eval(node.value)
                except ValueError:
                    return None
    if "MODEL_REMAPPING" not in tables or not (root / "models").is_dir():
        return None
    return root / "models", tables["MODEL_REMAPPING"], tables.get("MODEL_ARCHITECTURE_REMAPPING", {})


def _version() -> str:
    try:
        return importlib.metadata.version("mlx-lm")
    except importlib.metadata.PackageNotFoundError:
        return "(unknown version)"


def weights_problem(folder: Path) -> str | None:
    files = sorted(folder.glob(WEIGHTS))
    index, problem = read_json(folder / INDEX) if (folder / INDEX).is_file() else ({}, None)
    if problem:
        return f"{problem}: {AGAIN}"
    shards = index.get("weight_map") if isinstance(index, dict) else None
    if isinstance(shards, dict):
        missing = sorted({str(s) for s in shards.values()} - {f.name for f in files})
        if missing:
            more = f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""
            return f"{folder / missing[0]}{more}, named in {folder / INDEX}, is missing: {AGAIN}"
    if not files:
        return _no_weights(folder)
    for f in files:
        if problem := safetensors_problem(f):
            return problem
    return None


def _no_weights(folder: Path) -> str:
    others = sorted(p.name for p in folder.glob("*.safetensors"))
    if others:
        return (f"{folder} has no {WEIGHTS} file, which is all mlx-lm loads (it holds {others[0]}): convert the "
                "model with mlx_lm.convert")
    foreign = sorted(p.name for pattern in FOREIGN_WEIGHTS for p in folder.glob(pattern))
    if foreign:
        return (f"{folder} holds {foreign[0]}, but mlx-lm loads only safetensors weights ({WEIGHTS}): convert "
                "the model with mlx_lm.convert")
    return f"{folder} has no weights (no {WEIGHTS} file): {AGAIN}"


def safetensors_problem(path: Path) -> str | None:
    """A weights file whose header does not parse, or that ends before the tensors its header lists."""
    try:
        size = path.stat().st_size
        with open(path, "rb") as f:
            length = int.from_bytes(f.read(8), "little")
            if size < 8 or length > min(size - 8, HEADER_LIMIT):
                return f"{path} is not a safetensors file (or is cut short): {AGAIN}"
            header = json.loads(f.read(length))
    except OSError as exc:
        return f"{path} cannot be read ({exc.strerror or exc})"
    except (ValueError, UnicodeDecodeError):
        return f"{path} is not a safetensors file (its header is not JSON): {AGAIN}"
    try:
        end = max((int(t["data_offsets"][1]) for k, t in header.items() if k != "__metadata__"), default=0)
    except (AttributeError, KeyError, IndexError, TypeError, ValueError):
        return f"{path} is not a safetensors file (its header lists no tensors): {AGAIN}"
    if 8 + length + end > size:
        return f"{path} is cut short ({size} bytes, its header lists {8 + length + end}): {AGAIN}"
    return None


def tokenizer_problem(folder: Path) -> str | None:
    for name in TOKENIZER_JSON:
        if (folder / name).is_file():
            _, problem = read_json(folder / name)
            if problem:
                return f"{problem}, so the tokenizer does not load: copy it again from the original model"
    if not any((folder / name).is_file() for name in VOCABULARIES) and not any(folder.glob("*.tiktoken")):
        return (f"{folder} has no tokenizer (no {', '.join(VOCABULARIES[:-1])} or {VOCABULARIES[-1]}): copy the "
                "tokenizer files from the original model")
    if not (folder / "tokenizer_config.json").is_file():
        return (f"{folder / 'tokenizer_config.json'} is missing, so the tokenizer has no settings and no chat "
                "template: copy it from the original model")
    return None
