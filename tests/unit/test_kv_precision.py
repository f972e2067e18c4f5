"""KV_BITS in the accounting, without MLX: what a quantized row costs (packed bits, a scale and a bias per group),
what the same KV_MEMORY_BYTES then admits, and the precision as /health, /metrics and status show it."""

from __future__ import annotations

import msgspec
import pytest

from engine.rank0.kv_budget import KVBudget, KVMemory, token_bytes
from engine.rank0.kv_precision import label, row_bytes
from engine.rank0.prefix_index import PrefixIndex
from engine.rank0.requests import Counters
from engine.rank0.scheduler import Scheduler
from ipc.messages import Info
from tests.unit.test_kv_budget import QWEN3_4B, plan, request, submit
from tests.unit.test_scheduler import EOS, extract

# SmolLM2-135M: 30 layers, 3 KV heads of 64
SMOLLM2 = {"num_hidden_layers": 30, "num_attention_heads": 9, "num_key_value_heads": 3, "head_dim": 64,
           "hidden_size": 576}
BUDGET = 1 << 30


def test_a_quantized_row_is_its_packed_bits_plus_a_scale_and_a_bias_per_group():
    assert row_bytes(128, 2, None, 64) == 256
    assert row_bytes(128, 2, 8, 64) == 128 + 2 * 2 * 2  # 128 bytes of 8-bit values, 2 groups x (scale, bias) x bf16
    assert row_bytes(128, 2, 4, 64) == 64 + 2 * 2 * 2
    assert row_bytes(128, 2, 8, 32) == 128 + 4 * 2 * 2  # smaller groups: more scales and biases
    assert row_bytes(64, 4, 8, 64) == 64 + 1 * 2 * 4  # float32 models: the scales are float32 too


@pytest.mark.parametrize(("dtype", "bits", "low", "high"), [("bfloat16", 8, 0.52, 0.54), ("bfloat16", 4, 0.27, 0.29),
                                                             ("float32", 8, 0.26, 0.29), ("float32", 4, 0.14, 0.16)])
def test_one_tokens_kv_falls_by_what_the_bits_say(dtype: str, bits: int, low: float, high: float):
    for config in (QWEN3_4B, SMOLLM2):
        ratio = token_bytes(config, 1, dtype, bits=bits, group_size=64) / token_bytes(config, 1, dtype)
        assert low <= ratio <= high, (config, ratio)
    # pipeline and tensor shares are quantized alike
    assert token_bytes(QWEN3_4B, 2, dtype, 0, bits, 64) * 2 == token_bytes(QWEN3_4B, 1, dtype, 0, bits, 64)
    assert token_bytes(QWEN3_4B, 2, dtype, 18, bits, 64) * 2 == token_bytes(QWEN3_4B, 1, dtype, 0, bits, 64)


@pytest.mark.parametrize(("bits", "low", "high"), [(8, 1.85, 1.95), (4, 3.4, 3.6)])
def test_the_same_kv_memory_budget_admits_about_twice_and_four_times_the_tokens(bits: int, low: float, high: float):
    budget = 8 * BUDGET  # tens of thousands of tokens: the cache's 256-token steps round off little
    full = KVBudget(budget, token_bytes(QWEN3_4B, 1, "bfloat16"))
    quantized = KVBudget(budget, token_bytes(QWEN3_4B, 1, "bfloat16", bits=bits, group_size=64))
    assert low <= quantized.room(0) / full.room(0) <= high
    # a prompt the float cache must refuse fits once quantized
    long_prompt = int(full.room(0) * 1.5)
    assert full.refusal(long_prompt, 1) is not None and quantized.refusal(long_prompt, 1) is None


@pytest.mark.parametrize(("bits", "low", "high"), [(8, 1.85, 1.95), (4, 3.4, 3.6)])
def test_the_scheduler_runs_about_twice_and_four_times_the_sequences_at_once(bits: int, low: float, high: float):
    def admitted(kv_bits: int | None) -> int:
        kv = KVBudget(BUDGET, token_bytes(QWEN3_4B, 1, "bfloat16", bits=kv_bits, group_size=64))
        sched = Scheduler(64, {EOS}, Counters(), extract, PrefixIndex(0), kv)
        submit(sched, *(request(f"r{i}", prompt=900, max_tokens=100) for i in range(64)))
        return len(plan(sched).inserts)

    full = admitted(None)
    assert full >= 4 and low <= admitted(bits) / full <= high + 1 / full  # whole sequences: one more may fit


def test_the_precision_reads_as_the_float_type_or_the_bits_and_group():
    assert label(None, 64, "mlx.core.bfloat16") == "bf16"
    assert label(None, 64, "torch.float16") == "fp16" and label(None, 64, "float32") == "fp32"
    assert label(8, 64, "mlx.core.bfloat16") == "8-bit, group 64" and label(4, 32, "") == "4-bit, group 32"


@pytest.fixture
def info() -> Info:
    return Info(model="m", model_path="/m", context_length=4096, ranks=1, backend="single", created=0, engine_pid=1,
                kv_budget_bytes=2 << 30, kv_token_bytes=78336, kv_measured=True, kv_precision="8-bit, group 64",
                kv_bits=8, kv_group_size=64)


def test_health_metrics_and_status_show_the_kv_precision(info):
    from api.health import details
    from api.metrics import _kv_memory
    from ops.status import describe_info

    memory = details(info)["kv_memory"]
    assert (memory["precision"], memory["bits"], memory["group_size"]) == ("8-bit, group 64", 8, 64)
    (cache,) = [m for m in _kv_memory(info) if m.name == "mcs_kv_cache"]
    assert cache.samples[0].labels == {"precision": "8-bit, group 64", "bits": "8", "group_size": "64"}
    line = [ln for ln in describe_info(info).splitlines() if "KV memory" in ln][0]
    assert line.endswith("78336 bytes per token; keys and values in 8-bit, group 64 (KV_BITS=8, KV_GROUP_SIZE=64)")
    full = msgspec.structs.replace(info, kv_precision="bf16", kv_bits=0, kv_group_size=0, kv_budget_bytes=0)
    assert describe_info(full).count("keys and values in bf16 (KV_BITS=off)") == 1  # the no-limit line says it too
    # an engine older than the field: nothing claimed
    assert "keys and values" not in describe_info(msgspec.structs.replace(info, kv_precision=""))


def test_rank_0_falls_back_to_the_configs_kv_at_the_quantized_size(tmp_path):
    from types import SimpleNamespace

    from config import load_settings
    from engine.__main__ import _kv_budget
    from ipc.messages import ModelFacts

    empty = tmp_path / "empty.env"
    empty.touch()
    settings = load_settings({"KV_MEMORY_BYTES": str(BUDGET), "KV_BITS": "4", "KV_GROUP_SIZE": "32"}, empty)
    loaded = SimpleNamespace(facts=ModelFacts(config=QWEN3_4B, dtype="bfloat16"), pipeline_split=())
    kv, measured = _kv_budget(settings, loaded, 2, [], [[1, *KVMemory(640).row()], [0] * 9], 256)
    assert not measured and kv.token_bytes == 36 * 2 * 4 * row_bytes(128, 2, 4, 32)
