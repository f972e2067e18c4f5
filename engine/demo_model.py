"""Deterministic, offline demo models: tiny random-weight Qwen3 checkpoints that mlx-lm loads.

The server needs a model that exists without a network or a model hub: the default model of a
fresh install, and the model every test uses. This module writes one from nothing but code:

- a byte-level BPE tokenizer trained with `tokenizers` on a corpus embedded below (English prose,
  JSON and tool-call snippets), with Qwen's ChatML special tokens and a Qwen3-style chat template;
- random weights for mlx-lm's `qwen3` architecture, drawn from numpy's PCG64 with a fixed seed.

Every file is a pure function of this module's source, so each Mac of a cluster can generate its
own copy and all ranks hold bit-identical weights without copying anything. The text the models
write is gibberish by construction.

Sizes (`DEMO_MODELS`): "tiny" (about 0.2M parameters, vocab 1024; the default, for tests) and
"small" (about 10M parameters, vocab 4096; for benchmarks). Head counts and the MLP width divide
by 4, so 2- and 4-way tensor parallelism (`mlx_lm.utils.sharded_load`) works.

    python -m engine.demo_model [--size tiny|small] [--cache-dir DIR]   # prints the model's path
"""

from __future__ import annotations

import argparse
import fcntl
import json
import math
import os
import shutil
import sys
import tempfile
import time
import zlib
from dataclasses import dataclass
from pathlib import Path

DEMO_MODELS = ("tiny", "small")

# Part of the directory name: bump it whenever anything below changes the generated files, so an
# old cached copy is never mistaken for the current one.
VERSION = 1
MARKER_FILE = "demo-model.json"
DEFAULT_CACHE_DIR = Path("~/.cache/mlx-cluster-serve").expanduser()

_SEED = 0x6D6C78  # "mlx"


@dataclass(frozen=True)
class _Spec:
    hidden: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    vocab: int
    filler_words: int  # pseudo-words added to the tokenizer corpus, see _filler_lines


_SPECS = {
    "tiny": _Spec(hidden=64, layers=2, heads=4, kv_heads=4, head_dim=16, intermediate=128, vocab=1024, filler_words=0),
    "small": _Spec(hidden=256, layers=8, heads=8, kv_heads=4, head_dim=32, intermediate=1024, vocab=4096, filler_words=2400),
}

# Qwen's layout: the ChatML tokens are special (dropped by decode(skip_special_tokens=True)); the
# think and tool tokens are plain added tokens, so they survive decoding and the server's parsers see
# them in the text. Single tokens matter: mlx-lm finds reasoning and tool calls by token ids.
ENDOFTEXT, IM_START, IM_END = "<|endoftext|>", "<|im_start|>", "<|im_end|>"
_SPECIAL_TOKENS = (ENDOFTEXT, IM_START, IM_END)
_ADDED_TOKENS = ("<think>", "</think>", "<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>")

# Qwen3's template, trimmed: no reasoning_content bookkeeping. mlx-lm picks its "json_tools" parser
# because the template names both "<tool_call>" and "tool_call.name".
CHAT_TEMPLATE = """\
{%- macro render_content(content) -%}
    {%- if content is string -%}
        {{- content -}}
    {%- elif content is iterable and content is not mapping -%}
        {%- for part in content -%}
            {%- if part is mapping and part.type == 'text' -%}{{- part.text -}}{%- endif -%}
        {%- endfor -%}
    {%- endif -%}
{%- endmacro -%}
{%- if tools %}
    {{- '<|im_start|>system\\n' }}
    {%- if messages and messages[0].role == 'system' %}
        {{- render_content(messages[0].content) + '\\n\\n' }}
    {%- endif %}
    {{- "# Tools\\n\\nYou may call one or more functions to assist with the user query.\\n\\nYou are provided with function signatures within <tools></tools> XML tags:\\n<tools>" }}
    {%- for tool in tools %}
        {{- "\\n" }}
        {{- tool | tojson }}
    {%- endfor %}
    {{- "\\n</tools>\\n\\nFor each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:\\n<tool_call>\\n{\\"name\\": <function-name>, \\"arguments\\": <args-json-object>}\\n</tool_call><|im_end|>\\n" }}
{%- elif messages and messages[0].role == 'system' %}
    {{- '<|im_start|>system\\n' + render_content(messages[0].content) + '<|im_end|>\\n' }}
{%- endif %}
{%- for message in messages %}
    {%- set content = render_content(message.content) %}
    {%- if message.role == 'user' or (message.role == 'system' and not loop.first) %}
        {{- '<|im_start|>' + message.role + '\\n' + content + '<|im_end|>\\n' }}
    {%- elif message.role == 'assistant' %}
        {{- '<|im_start|>assistant\\n' + content }}
        {%- if message.tool_calls %}
            {%- for tool_call in message.tool_calls %}
                {%- if (loop.first and content) or (not loop.first) %}
                    {{- '\\n' }}
                {%- endif %}
                {%- if tool_call.function %}
                    {%- set tool_call = tool_call.function %}
                {%- endif %}
                {{- '<tool_call>\\n{"name": "' }}
                {{- tool_call.name }}
                {{- '", "arguments": ' }}
                {%- if tool_call.arguments is string %}
                    {{- tool_call.arguments }}
                {%- else %}
                    {{- tool_call.arguments | tojson }}
                {%- endif %}
                {{- '}\\n</tool_call>' }}
            {%- endfor %}
        {%- endif %}
        {{- '<|im_end|>\\n' }}
    {%- elif message.role == 'tool' %}
        {%- if loop.first or messages[loop.index0 - 1].role != 'tool' %}
            {{- '<|im_start|>user' }}
        {%- endif %}
        {{- '\\n<tool_response>\\n' + content + '\\n</tool_response>' }}
        {%- if loop.last or messages[loop.index0 + 1].role != 'tool' %}
            {{- '<|im_end|>\\n' }}
        {%- endif %}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\\n' }}
    {%- if enable_thinking is defined and enable_thinking is false %}
        {{- '<think>\\n\\n</think>\\n\\n' }}
    {%- endif %}
{%- endif %}
"""

# The tokenizer's training text. Written for this module; what matters is that common English,
# numbers, punctuation, JSON and ChatML/tool-call markup all get sensible merges.
_CORPUS = """\
The lighthouse keeper climbed the stairs every evening at half past six. There were one hundred and
twelve steps, and he counted them out loud, because counting kept his mind from wandering toward the
sea. At the top he wiped the salt from the glass, trimmed the wick, and lit the lamp. Ships passed in
the dark without ever knowing his name, and that suited him well.
On Sunday mornings the village market opened early. Farmers brought apples, pears, potatoes, onions,
carrots, cabbages and fresh eggs. A baker sold warm bread and small round cakes with honey. Children
ran between the stalls while their parents argued, politely, about the price of cheese. By noon the
square was quiet again, and only the pigeons remained to collect what had fallen.
A computer cluster is a group of machines that work together as if they were one. Each machine holds
part of the model, computes its share of every layer, and exchanges the results with the others over
a fast network. When the network is slow, the whole cluster waits for the slowest link; when it is
fast, a model that does not fit on any single machine can answer questions in real time.
Weather report for Tuesday: cloudy in the morning with a chance of light rain, clearing in the
afternoon. The high will be 18 degrees Celsius (64 F), the low 9 degrees. Winds from the west at 15 to
20 kilometers per hour. On Wednesday expect sunshine and temperatures near 21 degrees.
To make a simple tomato soup, you need four ripe tomatoes, one onion, two cloves of garlic, a spoon of
olive oil, salt, pepper and half a liter of water. First, chop the onion and the garlic. Second, warm
the oil in a pot and cook them until they are soft. Third, add the tomatoes and the water, and let it
simmer for twenty minutes. Finally, blend the soup until it is smooth and serve it hot.
"Where are you going?" she asked. "To the station," he said. "The train leaves at 7:45, and I would
rather not miss it again." She laughed. "You said that yesterday, and the day before." He picked up
his coat, his hat and his umbrella, and walked out into the rain without another word.
Questions and answers. What is the capital of France? The capital of France is Paris. How many days
are there in a week? There are seven days in a week. What is 12 plus 30? It is 42. Which planet is the
largest? Jupiter is the largest planet in our solar system. Why is the sky blue? Because air scatters
blue light from the sun more strongly than red light.
The history of writing begins with marks on clay and stone. Merchants needed to record what they had
bought and sold, and kings wanted their victories remembered. Over thousands of years these marks
became letters, the letters became books, and the books became libraries where anyone could learn
what others had thought long before they were born.
Please summarize the following document in three sentences. Translate this paragraph into French.
Write a short poem about the ocean. Explain the difference between a list and a dictionary. List
five animals that live in the forest: deer, fox, owl, bear and squirrel. Thank you for your help!
Numbers and dates: 0 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 19 20 25 50 75 100 256 512 1024 2048
4096 8192 65536 3.14159 2.71828 1e-6 -1 +1 50% $19.99 EUR 12,50 2024-05-17 12:30:00 v1.2.3 #1 (a) [b]
Punctuation: . , ; : ! ? ' " ` ~ @ # $ % ^ & * ( ) [ ] { } < > / \\ | _ - + = ... -- -> => == != <= >=
def add(a, b):
    \"\"\"Return the sum of a and b.\"\"\"
    return a + b

for i in range(10):
    if i % 2 == 0:
        print(f"{i} is even")
    else:
        print(f"{i} is odd")

import json
data = json.loads('{"key": "value", "items": [1, 2, 3], "ok": true, "missing": null}')
{"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}}
{"name": "get_weather", "arguments": {"city": "Tokyo", "unit": "fahrenheit"}}
{"name": "search_web", "arguments": {"query": "latest news about the solar eclipse", "max_results": 5}}
{"name": "send_email", "arguments": {"to": "alice@example.com", "subject": "Meeting", "body": "See you at 10."}}
{"type": "function", "function": {"name": "get_weather", "description": "Get the current weather in a city", "parameters": {"type": "object", "properties": {"city": {"type": "string", "description": "The city name"}}, "required": ["city"]}}}
{"id": "call_1", "type": "function", "function": {"name": "get_time", "arguments": "{\\"timezone\\": \\"UTC\\"}"}}
{"temperature": 21.5, "condition": "sunny", "humidity": 0.4, "wind": {"speed": 12, "direction": "NW"}}
{"model": "demo-tiny", "messages": [{"role": "user", "content": "Hello!"}], "stream": true}
<|im_start|>system
You are a helpful assistant.<|im_end|>
<|im_start|>user
What is the weather like in Paris today?<|im_end|>
<|im_start|>assistant
<think>
The user asks about the weather in Paris. I should call the weather tool.
</think>

<tool_call>
{"name": "get_weather", "arguments": {"city": "Paris"}}
</tool_call><|im_end|>
<|im_start|>user
<tool_response>
{"temperature": 18, "condition": "cloudy"}
</tool_response><|im_end|>
<|im_start|>assistant
It is 18 degrees and cloudy in Paris right now.<|im_end|>
# Markdown heading
## Second level
- first item
- second item
1. one
2. two
**bold** and *italic* and `code` and [a link](https://example.com/path?query=1&page=2).
| name | value |
| ---- | ----- |
| alpha | 1 |
Unicode: café, naïve, résumé, Straße, Ærø, Zürich, São Paulo, Kraków, Ελληνικά, Русский, 日本語, 中文, 한국어, العربية, emoji 🙂🚀✨
"""

# Pseudo-words pad the corpus so the merge budget of a large vocab is reached: the prose alone runs
# out of pairs after about 1400 merges. The prose is repeated three times and each pseudo-word
# appears twice, so every English merge (count >= 3) is learnt before any whole pseudo-word.
_SYLLABLES = [c + v for c in "bdfgklmnprstvz" for v in "aeiou"]


def _filler_lines(count: int) -> list[str]:
    import numpy as np

    if count == 0:
        return []

    rng = np.random.default_rng([_SEED, 1])
    words = [
        "".join(_SYLLABLES[int(i)] for i in rng.integers(0, len(_SYLLABLES), int(n)))
        for n in rng.integers(2, 5, count)
    ]
    # Each pseudo-word appears twice: the trainer's min_frequency=2 ignores pairs seen once.
    tokens = [words[i % count] for i in rng.permutation(2 * count)]
    return [" ".join(tokens[i : i + 12]) + "." for i in range(0, len(tokens), 12)]


def _train_tokenizer(vocab_size: int, filler_words: int):
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    tok = Tokenizer(models.BPE())
    # Byte-level: every byte is in the alphabet, so any unicode text round-trips; and mlx-lm picks
    # its BPE streaming detokenizer when the decoder is ByteLevel.
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size - len(_ADDED_TOKENS),
        min_frequency=2,
        special_tokens=list(_SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    corpus = _CORPUS.splitlines(keepends=True) * 3 + [line + "\n" for line in _filler_lines(filler_words)]
    tok.train_from_iterator(corpus, trainer=trainer)
    tok.add_tokens([AddedToken(t, special=False, normalized=False) for t in _ADDED_TOKENS])
    if tok.get_vocab_size() != vocab_size:
        raise RuntimeError(f"tokenizer has {tok.get_vocab_size()} tokens, wanted {vocab_size}")
    return tok


def _byte_decoder() -> dict[str, int]:
    # GPT-2's byte-to-unicode table, which the ByteLevel pre-tokenizer uses, inverted.
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    chars = dict(zip(printable, printable))
    extra = 0
    for b in range(256):
        if b not in chars:
            chars[b] = 256 + extra
            extra += 1
    return {chr(c): b for b, c in chars.items()}


def _quiet_ids(vocab: dict[str, int]) -> list[int]:
    """Tokens the random model should (almost) never pick: special and added tokens, and pieces
    that are not whole printable UTF-8 on their own (stray bytes, control characters)."""
    decoder = _byte_decoder()
    quiet = {vocab[t] for t in _SPECIAL_TOKENS + _ADDED_TOKENS}
    for piece, idx in vocab.items():
        if idx in quiet:
            continue
        try:
            text = bytes(decoder[c] for c in piece).decode("utf-8")
        except UnicodeDecodeError:
            quiet.add(idx)
            continue
        if any(not ch.isprintable() and ch not in "\n\t" for ch in text):
            quiet.add(idx)
    return sorted(quiet)


def _write_json(path: Path, obj) -> None:
    path.write_text(json.dumps(obj, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")


def _uniform(name: str, shape: tuple[int, ...], std: float):
    import numpy as np

    # One stream per tensor, keyed by its name: a tensor's values do not depend on which other
    # tensors exist. Uniform rather than normal: numpy's normal sampler calls exp() and log(), and
    # libm may differ by an ulp between macOS and Linux; this is integer bits and IEEE arithmetic
    # (math.sqrt is correctly rounded everywhere, pow is not).
    rng = np.random.default_rng([_SEED, zlib.crc32(name.encode())])
    return ((rng.random(shape, dtype=np.float64) * 2.0 - 1.0) * (std * math.sqrt(3.0))).astype(np.float32)


def _weights(spec: _Spec, config: dict, quiet_ids: list[int]) -> dict:
    import mlx.core as mx
    import numpy as np
    from mlx.utils import tree_flatten
    from mlx_lm.models import qwen3

    # Build the real model only for its parameter names and shapes, so they always match what this
    # mlx-lm version loads.
    model = qwen3.Model(qwen3.ModelArgs.from_dict(config))
    weights = {}
    for name, param in sorted(tree_flatten(model.parameters())):
        shape = tuple(param.shape)
        if len(shape) == 1:  # RMSNorm scales
            value = np.ones(shape, dtype=np.float32)
        elif name.endswith("embed_tokens.weight"):
            # Big embeddings keep the residual stream token-dependent, so greedy output varies.
            value = _uniform(name, shape, 1.0)
        elif name == "lm_head.weight":
            value = _uniform(name, shape, 2.0 / math.sqrt(spec.hidden))
            # Tiny logits for special tokens: a random model should not stop at once, nor emit
            # stray <tool_call>/<think> tokens that send the server's parsers down odd paths. And for
            # broken UTF-8 pieces, so that streamed text equals the decoded text, as with real models.
            value[quiet_ids] *= 0.05
        else:
            value = _uniform(name, shape, 1.0 / math.sqrt(shape[1]))
        weights[name] = mx.array(value)
    return weights


def _generate(name: str, out: Path) -> dict:
    """Write every file of demo model `name` into the existing directory `out`; return the marker."""
    import mlx.core as mx

    spec = _SPECS[name]
    started = time.perf_counter()
    tok = _train_tokenizer(spec.vocab, spec.filler_words)
    tok.save(str(out / "tokenizer.json"), pretty=False)
    vocab = tok.get_vocab()
    eos_id, pad_id = vocab[IM_END], vocab[ENDOFTEXT]
    quiet_ids = _quiet_ids(vocab)

    config = {
        "architectures": ["Qwen3ForCausalLM"],
        "model_type": "qwen3",
        "hidden_size": spec.hidden,
        "num_hidden_layers": spec.layers,
        "num_attention_heads": spec.heads,
        "num_key_value_heads": spec.kv_heads,
        "head_dim": spec.head_dim,
        "intermediate_size": spec.intermediate,
        "vocab_size": spec.vocab,
        "max_position_embeddings": 4096,
        "rms_norm_eps": 1e-6,
        "rope_theta": 1000000.0,
        "rope_scaling": None,
        # Untied: with a tied head, a hidden state dominated by the current token's embedding makes
        # greedy decoding repeat that token forever.
        "tie_word_embeddings": False,
        "hidden_act": "silu",
        "attention_bias": False,
        "torch_dtype": "float32",
        "bos_token_id": None,
        "eos_token_id": [eos_id, pad_id],
        "pad_token_id": pad_id,
    }
    weights = _weights(spec, config, quiet_ids)
    params = sum(int(w.size) for w in weights.values())
    mx.save_safetensors(str(out / "model.safetensors"), weights, metadata={"format": "mlx"})
    _write_json(out / "config.json", config)
    _write_json(out / "generation_config.json", {"bos_token_id": None, "eos_token_id": [eos_id, pad_id], "pad_token_id": pad_id})
    _write_json(
        out / "tokenizer_config.json",
        {
            "tokenizer_class": "PreTrainedTokenizerFast",
            "model_max_length": 4096,
            "bos_token": None,
            "eos_token": IM_END,
            "pad_token": ENDOFTEXT,
            "unk_token": None,
            "add_bos_token": False,
            "add_prefix_space": False,
            "clean_up_tokenization_spaces": False,
            "split_special_tokens": False,
            "tool_parser_type": "json_tools",
            "chat_template": CHAT_TEMPLATE,
        },
    )
    _write_json(out / "special_tokens_map.json", {"eos_token": IM_END, "pad_token": ENDOFTEXT})
    marker = {
        "name": name,
        "version": VERSION,
        "parameters": params,
        "vocab_size": spec.vocab,
        "eos_token_id": eos_id,
        "dtype": "float32",
    }
    # Written last: a directory without it is unfinished and never used.
    _write_json(out / MARKER_FILE, marker)
    marker["seconds"] = time.perf_counter() - started  # returned, not written: files stay reproducible
    return marker


def _check_name(name: str) -> None:
    if name not in _SPECS:
        raise ValueError(f"unknown demo model {name!r}; accepted: {', '.join(DEMO_MODELS)}")


def demo_model_path(name: str, cache_dir: Path) -> Path:
    """Where demo model `name` lives (or will live) under `cache_dir`."""
    _check_name(name)
    return Path(cache_dir) / f"demo-{name}-v{VERSION}"


def _is_complete(path: Path) -> bool:
    try:
        marker = json.loads((path / MARKER_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    return marker.get("version") == VERSION


def ensure_demo_model(name: str, cache_dir: Path) -> Path:
    """Return the path of demo model `name`, generating it first if `cache_dir` lacks it.

    Safe when several processes (the local ranks of one host) call it at once: each generates
    into its own temporary directory and renames it into place; the losers, finding the target
    there, throw their copy away. Every copy is identical, so it does not matter who wins.
    """
    target = demo_model_path(name, cache_dir)
    if _is_complete(target):
        return target
    cache_dir = Path(cache_dir)
    cache_dir.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=cache_dir))
    try:
        _generate(name, tmp)
        # Generation runs unlocked (a second of duplicated work at worst); the lock only makes
        # "check, clear a leftover, rename" one step, so no process removes a finished model.
        with open(cache_dir / f".{target.name}.lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            if not _is_complete(target):
                if target.exists():  # no marker: unfinished, or written by hand
                    shutil.rmtree(target)
                os.rename(tmp, target)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return target


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m engine.demo_model", description=__doc__.splitlines()[0])
    parser.add_argument("--size", choices=DEMO_MODELS, default=DEMO_MODELS[0])
    parser.add_argument("--cache-dir", type=Path, default=DEFAULT_CACHE_DIR)
    args = parser.parse_args(argv)
    path = ensure_demo_model(args.size, args.cache_dir.expanduser())
    info = json.loads((path / MARKER_FILE).read_text(encoding="utf-8"))
    # stdout is only the path, for scripts; the summary goes to stderr.
    print(f"demo-{info['name']}: {info['parameters']:,} parameters, vocab {info['vocab_size']}", file=sys.stderr)
    print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
