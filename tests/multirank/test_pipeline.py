"""Pipeline parallel on two real ranks (mlx.launch, ring backend): each rank holds whole layers.

Greedy answers must equal mlx-lm's own pipelined load (sharded_load(pipeline_group=...) under mlx.launch,
tests/multirank/mlx_lm_pipelined.py), alone and in a batch, with the prefix cache on and off, and with
an unequal layer split; a model that cannot run as asked is refused in one sentence.
"""

from __future__ import annotations

import concurrent.futures as cf
import json
import re
import subprocess

from pathlib import Path

import openai
import pytest

from bench.perplexity import api_logprobs, inprocess_logprobs
from ops.procs import free_port_run
from tests.harness import MLX_LAUNCH, MODEL_CACHE, PYTHON, REPO, Stack
from tests.launch_stack import Launch

pytestmark = pytest.mark.multirank

CHATS = ["Tell me a story about a cluster of Macs.", "hello", "Why is the sky blue? Answer in one line, please.",
         "the quick brown fox jumps over a lazy dog " * 6]
MAX_TOKENS = [12, 7, 16, 10]
CACHE_OFF = {"PROMPT_CACHE_BYTES": "0"}


def _model_path(name: str):
    """A zoo model by name (without "zoo-"), or a model folder by its absolute path."""
    from engine.zoo import ensure_zoo_model

    return Path(name) if Path(name).is_absolute() else ensure_zoo_model(name, MODEL_CACHE)


def _prompts(name: str) -> list[list[int]]:
    """Each chat as the engine renders it: the model's chat template, with the generation prompt."""
    from mlx_lm.tokenizer_utils import load

    tokenizer = load(_model_path(name))
    return [tokenizer.apply_chat_template([{"role": "user", "content": c}], add_generation_prompt=True)
            for c in CHATS]


def _with_index(name: str, folder):
    """The zoo model as mlx_lm.convert writes a model: with model.safetensors.index.json, which mlx-lm's pipelined
    load reads to find each rank's files (the zoo writes one file and no index)."""
    source = _model_path(name)
    folder.mkdir()
    for f in source.iterdir():
        (folder / f.name).symlink_to(f)
    with open(source / "model.safetensors", "rb") as f:
        header = json.loads(f.read(int.from_bytes(f.read(8), "little")))
    weights = {k: "model.safetensors" for k in header if k != "__metadata__"}
    (folder / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weights}))
    return folder


def mlx_lm_pipelined(name: str, tmp_path, mode: str = "pipeline", ranks: int = 2) -> list[str]:
    """The greedy answers of mlx-lm's own pipelined (or, mode "tensor", sharded; "whole", one process) load of the
    model on `ranks` ranks."""
    prompts, out = tmp_path / "prompts.json", tmp_path / "out.json"
    prompts.write_text(json.dumps([{"tokens": t, "max_tokens": m} for t, m in zip(_prompts(name), MAX_TOKENS)]))
    script = [PYTHON, str(REPO / "tests/multirank/mlx_lm_pipelined.py"),
              str(_with_index(name, tmp_path / Path(name).name)), str(prompts), str(out), mode]
    cmd = script if mode == "whole" else [
        MLX_LAUNCH, "--hosts", ",".join(["127.0.0.1"] * ranks), "--backend", "ring", "--starting-port",
        str(free_port_run(ranks)), "--cwd", str(REPO), "--", *script]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=300, stdin=subprocess.DEVNULL)
    assert out.exists(), r.stdout[-2000:] + r.stderr[-2000:]
    return [row["text"] for row in json.loads(out.read_text())]


def chat(client, content: str, max_tokens: int) -> str:
    r = client.chat.completions.create(model="default", messages=[{"role": "user", "content": content}],
                                       max_tokens=max_tokens, temperature=0)
    return r.choices[0].message.content


def serve(name: str, ranks: int = 2, **extra: str):
    model = name if Path(name).is_absolute() else "zoo-" + name
    s = Stack(extra={"MODEL": model, "HOSTS": ",".join(["127.0.0.1"] * ranks), **extra})
    engine = s.start_engine(ranks=ranks)
    api = s.start_api()
    client = openai.OpenAI(base_url=s.base_url + "/v1", api_key="x", max_retries=0, timeout=120)
    return s, engine, api, client


def stop(client, api, engine) -> None:
    """Stop what serve() started."""
    client.close()
    api.stop()
    engine.stop()


def clean_log(engine) -> str:
    """The engine's log, which must hold no ERROR and no traceback."""
    log = engine.log.read_text(errors="replace")
    assert "ERROR" not in log and "Traceback" not in log, log[-3000:]
    return log


def seeded_twice(client) -> list[str]:
    """One seeded sampled chat asked twice: the same tokens on every rank (a desync would end the engine) and every
    time."""
    kw = dict(model="default", messages=[{"role": "user", "content": "hi"}], max_tokens=16, temperature=0.9, seed=7)
    return [client.chat.completions.create(**kw).choices[0].message.content for _ in range(2)]


def answers(name: str, ranks: int = 2, **extra: str) -> tuple[list[str], list[str], str, dict]:
    """(one by one, all at once, engine log, Info) of the chats on `ranks` ranks."""
    s, engine, api, client = serve(name, ranks, **extra)
    try:
        alone = [chat(client, c, m) for c, m in zip(CHATS, MAX_TOKENS)]
        with cf.ThreadPoolExecutor(len(CHATS)) as pool:  # continuous batching: one batch, every row its own
            together = list(pool.map(lambda cm: chat(client, *cm), zip(CHATS, MAX_TOKENS)))
        sampled = seeded_twice(client)
        assert sampled[0] == sampled[1]
        info = s.probe()
    finally:
        stop(client, api, engine)
    log = clean_log(engine)
    return alone, together, log, info


@pytest.fixture(scope="module")
def qwen3_next_reference(tmp_path_factory) -> list[str]:
    return mlx_lm_pipelined("qwen3-next", tmp_path_factory.mktemp("ref"))


def test_qwen3_next_runs_pipelined_by_default_and_answers_as_mlx_lm_pipelined(qwen3_next_reference):
    alone, together, log, info = answers("qwen3-next", **CACHE_OFF)
    assert alone == qwen3_next_reference
    assert together == qwen3_next_reference
    assert "qwen3_next has no tensor parallelism in mlx-lm (no shard()): running it in pipeline parallel" in log
    assert re.search(r"rank1 .*rank 1 of 2 joined: .*pipeline parallel: 2 of 4 layers", log), log[-2000:]
    assert (info["parallel"], info["pipeline_layers"]) == ("pipeline", [2, 2])  # status, /health, the dashboard
    # admission counts what the busiest rank holds per token, as measured: the rank with the model's only
    # full-attention layer holds its K and V with all their heads (the other layers keep a constant state)
    config = json.loads((_model_path("qwen3-next") / "config.json").read_text())
    full = config["layer_types"].count("full_attention")
    assert info["kv_token_bytes"] == full * 2 * config["num_key_value_heads"] * config["head_dim"] * 4


def test_an_unequal_layer_split_answers_the_same(qwen3_next_reference):
    alone, _, log, info = answers("qwen3-next", PARALLEL="pipeline", PIPELINE_LAYERS="3,1", **CACHE_OFF)
    assert alone == qwen3_next_reference
    assert info["pipeline_layers"] == [3, 1]
    assert "4 layers over 2 ranks, rank 0: 3, rank 1: 1" in log
    assert re.search(r"rank0 .*rank 0 of 2 joined: .*pipeline parallel: 3 of 4 layers", log), log[-2000:]


@pytest.mark.parametrize("name", ["deepseek-v3", "qwen3-next"])
def test_a_model_with_both_modes_served_pipelined_answers_as_mlx_lm_with_the_prefix_cache_on_and_off(
        name, tmp_path, request):
    # qwen3-next pipelines by default: the first test checked its cache-off answers pipelined against this
    # reference; the other model's are checked on the cache-off stack at the end
    checked_off = name == "qwen3-next"
    reference = request.getfixturevalue("qwen3_next_reference") if checked_off else mlx_lm_pipelined(name, tmp_path)
    s, engine, api, client = serve(name, PARALLEL="pipeline")
    try:
        # a second conversation turn extends the first: its prefix comes from each rank's own layers' entries
        first = client.chat.completions.create(model="default", max_tokens=8, temperature=0,
                                               messages=[{"role": "user", "content": CHATS[0]}])
        turn = [{"role": "user", "content": CHATS[0]},
                {"role": "assistant", "content": first.choices[0].message.content},
                {"role": "user", "content": CHATS[2]}]
        cached = [client.chat.completions.create(model="default", max_tokens=12, temperature=0, messages=turn)
                  for _ in range(2)]
        on = [chat(client, c, m) for c, m in zip(CHATS, MAX_TOKENS)]
        # prompt logprobs: the last stage's logits reach every rank (all_gather); rank 0 reports them
        scored = api_logprobs(client, " ".join(CHATS * 8))[1]
    finally:
        stop(client, api, engine)
    log = clean_log(engine)
    assert on == reference
    local = inprocess_logprobs(_model_path(name), " ".join(CHATS * 8))
    assert len(scored) == len(local) and max(abs(a - b) for a, b in zip(scored[1:], local[1:])) < 1e-3
    assert cached[0].choices[0].message.content == cached[1].choices[0].message.content
    s2, engine2, api2, client2 = serve(name, PARALLEL="pipeline", **CACHE_OFF)
    try:
        fresh = client2.chat.completions.create(model="default", max_tokens=12, temperature=0, messages=turn)
        off = [] if checked_off else [chat(client2, c, m) for c, m in zip(CHATS, MAX_TOKENS)]
        sampled = [] if checked_off else seeded_twice(client2)
    finally:
        stop(client2, api2, engine2)
    clean_log(engine2)
    assert fresh.choices[0].message.content == cached[1].choices[0].message.content
    if not checked_off:
        assert off == reference and sampled[0] == sampled[1]
    # the second turn reuses the first's prompt; asked again, all but its own last token
    assert cached[0].usage.prompt_tokens_details.cached_tokens > 0
    assert cached[1].usage.prompt_tokens_details.cached_tokens == cached[1].usage.prompt_tokens - 1


def test_pipeline_asked_of_a_model_mlx_lm_only_shards_is_refused_by_check_start_and_the_engine():
    sentence = ("MODEL's architecture gpt_oss cannot run in pipeline parallel on 2 ranks: mlx-lm's gpt_oss model "
                "has no pipeline(); set PARALLEL=tensor")
    launch = Launch(MODEL="zoo-gpt-oss", PARALLEL="pipeline", HOSTS="127.0.0.1,127.0.0.1")
    check = launch.run("check")
    assert check.returncode == 1 and f"FAULT model: {sentence}" in check.stdout, check.stdout + check.stderr
    start = launch.run("start")
    assert start.returncode == 1 and sentence in start.stderr, start.stdout + start.stderr
    assert "Traceback" not in start.stderr and not (launch.root / "run" / "engine.pid").exists()
    # one rank holds the whole model: nothing to refuse
    assert launch.run("check", HOSTS="127.0.0.1").returncode == 0
    # the engine started without launch.sh refuses the same way, every rank, with no traceback
    s = Stack(extra={"MODEL": "zoo-gpt-oss", "PARALLEL": "pipeline"})
    with pytest.raises(RuntimeError, match="exited with") as failed:
        s.start_engine(ranks=2, timeout=60)
    assert sentence in str(failed.value) and "Traceback" not in str(failed.value)
