"""KV memory admission without MLX: the per-token estimate, the budget, and the scheduler keeping the batch's
KV and the prefix cache within it (queueing instead of growing, releasing what ends, the cache yielding first).

The scheduler is driven as the step loop drives it (next_plan, the step's results, the sizes the ranks
report after a plan stored or evicted); here one token's KV is 1 byte, so a sequence reserves its
prompt plus max_tokens rounded up to 256.
"""

from __future__ import annotations

import math

import msgspec
import pytest

from engine.lockstep.plan import Insert
from engine.lockstep.results import StepResults
from engine.rank0.kv_budget import KV_STEP, KVBudget, KVMemory, batch_bytes, memory_budget, steps, token_bytes
from engine.rank0.prefix_index import PrefixIndex
from engine.rank0.requests import Counters, Request
from engine.rank0.scheduler import Scheduler
from ipc import Error, Finish
from ipc.messages import Info, RankState
from tests.unit.test_scheduler import EOS, Detok, TextSplitter, extract

QWEN3_4B = {"num_hidden_layers": 36, "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 128,
            "hidden_size": 2560}


# ---- the estimate


def test_one_tokens_kv_is_layers_times_k_and_v_times_heads_times_head_size_times_dtype():
    assert token_bytes(QWEN3_4B, 1, "bfloat16") == 36 * 2 * 8 * 128 * 2
    assert token_bytes(QWEN3_4B, 1, "float32") == 36 * 2 * 8 * 128 * 4
    assert token_bytes(QWEN3_4B, 1, "") == 36 * 2 * 8 * 128 * 2  # no dtype named: MLX's half precision


def test_tensor_parallel_ranks_each_hold_their_share_of_the_kv_heads():
    assert token_bytes(QWEN3_4B, 2, "bfloat16") == 36 * 2 * 4 * 128 * 2
    assert token_bytes(QWEN3_4B, 8, "bfloat16") == 36 * 2 * 1 * 128 * 2
    # heads that do not divide evenly: the estimate stays an upper bound
    assert token_bytes(QWEN3_4B, 3, "bfloat16") == 36 * 2 * 3 * 128 * 2
    assert token_bytes(QWEN3_4B, 16, "bfloat16") == 36 * 2 * 1 * 128 * 2


def test_config_without_kv_heads_or_head_dim_uses_attention_heads_and_hidden_size():
    config = {"num_hidden_layers": 2, "num_attention_heads": 4, "hidden_size": 64}
    assert token_bytes(config, 1, "float16") == 2 * 2 * 4 * 16 * 2


def test_a_config_that_does_not_say_gives_no_estimate():
    assert token_bytes({"hidden_size": 64}, 1, "float16") == 0
    assert not KVBudget(10**9, 0).enabled


def test_a_sequence_reserves_its_prompt_and_max_tokens_in_the_caches_steps():
    kv = KVBudget(10**9, 1000)
    assert steps(1) == KV_STEP and steps(256) == 256 and steps(257) == 512
    assert kv.sequence(100, 100) == 1000 * 256
    assert kv.sequence(200, 100) == 1000 * 512


# ---- the measured memory: tokens, windows, constant state


def test_a_sliding_window_stops_growing_at_its_window_plus_the_prefill_chunk_it_concatenates():
    # gpt-oss-like: one full-attention layer and one 128-token window of 512 bytes per token each, 512-token chunks
    kv = KVBudget.of(10**12, KVMemory(512, 512, 128, 0), 512)
    assert kv.sequence(300, 0) == 512 * 512 + 512 * 300  # within a chunk the window layer holds all 300
    assert kv.sequence(100_000, 0) == 512 * steps(100_000) + 512 * (128 + 511)
    assert kv.window_tokens(10) == 128  # below its window it grows in steps, never past the window
    old = KVBudget(10**12, 1024)  # the config's formula: every layer keeps every token
    assert old.sequence(100_000, 0) / kv.sequence(100_000, 0) > 1.9


def test_linear_attention_state_is_reserved_once_per_sequence_whatever_its_length():
    kv = KVBudget.of(10**12, KVMemory(512, 0, 0, 33792), 512)
    assert kv.sequence(1, 0) == 512 * 256 + 33792
    assert kv.sequence(1000, 24) == 512 * 1024 + 33792
    assert batch_bytes([kv.sequence(10, 0), kv.sequence(600, 0)]) == 2 * (512 * 768 + 33792)


def test_room_and_refusal_count_the_window_and_the_state_too():
    kv = KVBudget.of(1 << 20, KVMemory(1024, 0, 0, 1 << 18), 512)  # a quarter of the budget is one sequence's state
    assert kv.room(300) == 768 - 300
    assert kv.refusal(300, 468) is None and kv.refusal(300, 469) is not None
    assert "1024 bytes per token + 262144 bytes of state per sequence" in kv.refusal(300, 469)
    windows = KVBudget.of(1 << 20, KVMemory(0, 1024, 32, 0), 16)  # only windows: memory stops growing
    assert windows.room(300) > 10**9 and windows.refusal(300, 10**6) is None


def test_rank_0_budgets_with_the_largest_ranks_numbers_sent_as_int32s():
    big = KVMemory(3 << 40, 7, 4096, (5 << 31) + 3)
    row = big.row()
    assert all(0 <= v < 2**31 for v in row) and KVMemory.from_row(row) == big
    assert KVMemory.largest([KVMemory(640, 0, 0, 10), KVMemory(320, 8, 32, 0)]) == KVMemory(640, 8, 32, 10)


def test_a_batch_holds_every_sequence_as_long_as_its_longest():
    assert batch_bytes([]) == 0
    assert batch_bytes([256, 4096, 512]) == 3 * 4096


def test_the_default_budget_is_half_of_what_the_smallest_rank_has_left():
    ranks = [RankState(rank=0, host_memory_total=64 << 30, active_memory=40 << 30),
             RankState(rank=1, host_memory_total=32 << 30, active_memory=16 << 30)]
    assert memory_budget(-1, ranks) == (16 << 30) // 2
    assert memory_budget(0, ranks) == 0
    assert memory_budget(5 << 20, ranks) == 5 << 20
    assert memory_budget(-1, [RankState(rank=0)]) == 0  # memory unknown: no limit
    # weights that left nothing: a budget nothing fits in (every request is refused, naming the setting)
    assert memory_budget(-1, [RankState(rank=0, host_memory_total=8 << 30, active_memory=9 << 30)]) == 1


def test_a_request_that_can_never_fit_is_refused_with_the_numbers_and_the_fixes():
    kv = KVBudget(1 << 20, 1024)  # 1 MiB: 1024 tokens
    assert kv.refusal(500, 500) is None
    assert kv.refusal(500, 500, n=2) is not None  # two choices of 1024 tokens each
    message = kv.refusal(3000, 100)
    assert str(1024 * 3328) in message and str(1 << 20) in message
    assert "3000 prompt + 100 max_tokens" in message and "1024 bytes per token" in message
    for fix in ("lower max_tokens", "shorten the prompt", "raise KV_MEMORY_BYTES"):
        assert fix in message
    assert "fewer choices (n)" in kv.refusal(500, 500, n=2)
    assert KVBudget(0, 1024).refusal(10**6, 10**6) is None  # no limit
    # a limit the server chose is not the client's to lower
    assert "lower max_tokens" not in kv.refusal(3000, 1, client_limit=False)


def test_a_request_without_a_limit_may_generate_what_the_budget_leaves_after_its_prompt():
    kv = KVBudget(1 << 20, 1024)  # 1024 tokens
    assert kv.room(300) == 724 and kv.refusal(300, kv.room(300)) is None
    assert kv.refusal(300, kv.room(300) + 1) is not None
    assert kv.room(300, n=2) == 512 - 300  # each choice its share, in the cache's steps
    assert kv.room(1100) < 1
    assert KVBudget(0, 1024).room(300) is None  # no budget: only the context limits it


# ---- the scheduler


def make(budget: int, cache: int = 0, max_batch: int = 8) -> Scheduler:
    return Scheduler(max_batch, {EOS}, Counters(), extract, PrefixIndex(cache), KVBudget(budget, 1))


def request(rid: str, prompt: int = 100, max_tokens: int = 100, outbox: list | None = None,
            tokens: list[int] | None = None) -> Request:
    tokens = tokens if tokens is not None else [7] * prompt
    return Request(insert=Insert(rid=rid, tokens=tokens, max_tokens=max_tokens),
                   outbox=outbox if outbox is not None else [], prompt_tokens=len(tokens), deadline=math.inf,
                   detok=Detok(), splitter=TextSplitter(), group=rid)


def submit(sched: Scheduler, *reqs: Request) -> None:
    assert sched.counters.admit(len(reqs), capacity=100)
    for r in reqs:
        sched.submit([r])


def plan(sched: Scheduler):
    """The next plan, applied by every rank (entries held at a byte per token)."""
    p = sched.next_plan(0, 0)
    if p.stores or p.evicts:
        sched.prefix.applied({i: e.length for i, e in sched.prefix.entries.items()})
    return p


def finish(sched: Scheduler, *rids: str) -> None:
    sched.absorb(StepResults(tokens=[(rid, EOS, "stop") for rid in rids]))


def test_requests_beyond_the_budget_wait_in_the_queue_instead_of_joining_the_batch():
    sched = make(budget=3 * 256)  # three sequences of 256 tokens
    submit(sched, *(request(f"r{i}") for i in range(5)))
    p = plan(sched)
    assert [i.rid for i in p.inserts] == ["r0", "r1", "r2"]
    assert sched.kv_reserved == 3 * 256 and sched.counters.waiting == 2 and sched.counters.active == 3
    assert not plan(sched).inserts  # nothing ended: nothing more joins, whatever MAX_BATCH allows
    assert sched.kv_reserved <= 3 * 256


def test_a_finished_sequence_releases_its_kv_and_the_next_in_line_joins():
    sched = make(budget=2 * 256)
    submit(sched, request("a"), request("b"), request("c"))
    assert [i.rid for i in plan(sched).inserts] == ["a", "b"]
    finish(sched, "a")
    assert sched.kv_reserved == 256
    assert [i.rid for i in plan(sched).inserts] == ["c"]
    finish(sched, "b", "c")
    assert sched.kv_reserved == 0


def test_a_cancelled_sequence_releases_its_kv_once_the_batch_lets_it_go():
    sched = make(budget=2 * 256)
    submit(sched, request("a"), request("b"), request("c"))
    plan(sched)
    sched.cancel("a")
    p = plan(sched)
    assert p.removes == ["a"] and [i.rid for i in p.inserts] == ["c"]
    assert sched.kv_reserved == 2 * 256


def test_failed_and_reset_sequences_release_their_kv():
    sched = make(budget=2 * 256)
    submit(sched, request("a"), request("b"), request("c"))
    plan(sched)
    sched.absorb(StepResults(failed={"a": "boom", "b": "the batch was reset"}))
    assert sched.kv_reserved == 0
    assert [i.rid for i in plan(sched).inserts] == ["c"]


def test_a_waiting_requests_cancel_leaves_the_queue():
    sched = make(budget=256)
    outbox: list = []
    submit(sched, request("a"), request("b", outbox=outbox))
    plan(sched)
    sched.cancel("b", Error(status=499, message="gone"))
    assert sched.counters.waiting == 0 and not sched.waiting


def test_the_batch_reserves_every_sequence_at_the_length_of_its_longest():
    sched = make(budget=4 * 256)
    submit(sched, request("long", prompt=500, max_tokens=12), request("short1"), request("short2"))
    # the long one takes 512 tokens, so each short one takes 512 too in the padded batch
    assert [i.rid for i in plan(sched).inserts] == ["long", "short1"]
    assert sched.kv_reserved == 2 * 512


def test_strict_fifo_a_big_request_at_the_head_holds_back_smaller_ones_behind_it():
    sched = make(budget=4 * 256)
    submit(sched, request("a"), request("big", prompt=600, max_tokens=100), request("small"))
    assert [i.rid for i in plan(sched).inserts] == ["a"]  # big needs 2 x 768: it waits, and small behind it
    finish(sched, "a")
    assert [i.rid for i in plan(sched).inserts] == ["big"]
    assert not plan(sched).inserts  # small would make the padded batch 2 x 768 > 1024
    finish(sched, "big")
    assert [i.rid for i in plan(sched).inserts] == ["small"]


def test_a_request_whose_choices_do_not_all_fit_starts_with_those_that_do():
    sched = make(budget=2 * 256)
    submit(sched, request("x"))
    plan(sched)
    choices = [request("g"), request("g/1"), request("g/2")]
    for i, r in enumerate(choices):
        r.group, r.index = "g", i
    submit(sched, *choices)
    assert [i.rid for i in plan(sched).inserts] == ["g"]
    finish(sched, "x")
    assert [i.rid for i in plan(sched).inserts] == ["g/1"]


def system(i: int) -> list[int]:
    return [1000 + i] + list(range(100, 300))  # 201 tokens, one distinct conversation each


def test_the_prefix_cache_yields_its_least_recently_used_entries_before_a_request_waits():
    sched = make(budget=4 * 256, cache=10**9)
    for i in range(3):  # three conversations end, each kept as a ~200-byte entry
        submit(sched, request(f"c{i}", tokens=system(i), max_tokens=20))
        plan(sched)
        sched.absorb(StepResults(tokens=[(f"c{i}", 50, None)]))
        sched.absorb(StepResults(tokens=[(f"c{i}", EOS, "stop")]))
        plan(sched)
    first, second, third = list(sched.prefix.entries)
    assert sched.prefix.nbytes == 3 * 202
    # four sequences of 256 need the whole budget: the cache gives up everything, oldest first
    submit(sched, *(request(f"r{i}") for i in range(4)))
    p = plan(sched)
    assert len(p.inserts) == 4 and p.evicts == [first, second, third]
    assert sched.kv_reserved + sched.prefix.nbytes <= 4 * 256


def test_the_prefix_cache_gives_up_only_what_the_request_needs():
    sched = make(budget=4 * 256, cache=10**9)
    for i in range(3):
        submit(sched, request(f"c{i}", tokens=system(i), max_tokens=20))
        plan(sched)
        sched.absorb(StepResults(tokens=[(f"c{i}", EOS, "stop")]))
        plan(sched)
    entries = list(sched.prefix.entries)
    submit(sched, request("r0"), request("r1"))  # 512 of 1024: the cache may keep 512
    p = plan(sched)
    assert len(p.inserts) == 2 and p.evicts == [entries[0]] and list(sched.prefix.entries) == entries[1:]


def test_an_entry_not_yet_stored_counts_against_the_budget_at_its_estimate():
    sched = make(budget=2 * 256, cache=10**9)
    submit(sched, request("a", tokens=system(0), max_tokens=20), request("b"), request("c"))
    assert [i.rid for i in plan(sched).inserts] == ["a", "b"]
    sched.absorb(StepResults(tokens=[("a", 50, None), ("b", 51, None)]))
    sched.absorb(StepResults(tokens=[("a", EOS, "stop")]))
    # a's KV is about to become an entry (this plan stores it): c does not fit next to b and it yet
    p = sched.next_plan(0, 0)
    assert p.stores and not p.inserts
    sched.prefix.applied({i: e.length for i, e in sched.prefix.entries.items()})
    # stored and measured, the entry yields to c
    p = plan(sched)
    assert [i.rid for i in p.inserts] == ["c"] and p.evicts


def test_without_a_budget_the_batch_grows_to_max_batch():
    sched = Scheduler(4, {EOS}, Counters(), extract, None, KVBudget(0, 1))
    submit(sched, *(request(f"r{i}", prompt=10**5) for i in range(6)))
    assert len(plan(sched).inserts) == 4
    assert sched.kv_reserved == 4 * steps(10**5 + 100)  # still reported


def test_a_request_that_fits_an_empty_engine_always_gets_in():
    sched = make(budget=1024, cache=10**9)
    submit(sched, request("a", tokens=system(0), max_tokens=20))
    plan(sched)
    finish(sched, "a")
    plan(sched)
    submit(sched, request("whole", prompt=900, max_tokens=100))  # exactly the budget
    assert [i.rid for i in plan(sched).inserts] == ["whole"] and not sched.prefix.entries
    sched.absorb(StepResults(tokens=[("whole", EOS, "stop")]))
    (ev,) = [e for _, e in sched.take_events() if isinstance(e, Finish) and e.request_id == "whole"]
    assert ev.finish_reason == "stop"


# ---- reporting


@pytest.fixture
def info() -> Info:
    return Info(model="m", model_path="/m", context_length=4096, ranks=1, backend="single", created=0, engine_pid=1,
                prompt_cache_budget=1 << 30, prompt_cache_bytes=256 << 20, kv_budget_bytes=2 << 30,
                kv_reserved_bytes=768 << 20, kv_token_bytes=147456, kv_window_token_bytes=4096, kv_window=128,
                kv_constant_bytes=1 << 20, kv_measured=True)


def test_status_health_and_metrics_report_the_kv_memory(info):
    from api.health import details
    from api.metrics import _kv_memory
    from ops.status import describe_info

    line = [ln for ln in describe_info(info).splitlines() if "KV memory" in ln][0]
    assert "768.0 MiB reserved" in line and "256.0 MiB prefix cache of 2.00 GiB" in line and "(50 %)" in line
    assert line.endswith("147456 bytes per token + 4096 bytes per token of a 128-token window + 1048576 bytes of "
                         "state per sequence")
    assert details(info)["kv_memory"] == {"budget_bytes": 2 << 30, "reserved_bytes": 768 << 20,
                                          "token_bytes": 147456, "window_token_bytes": 4096, "window_tokens": 128,
                                          "constant_bytes": 1 << 20, "measured": True, "precision": "",
                                          "bits": 0, "group_size": 0}
    values = {m.name: m.samples[0].value for m in _kv_memory(info)}
    assert values == {"mcs_kv_cache": 1, "mcs_kv_budget_bytes": 2 << 30, "mcs_kv_reserved_bytes": 768 << 20,
                      "mcs_kv_token_bytes": 147456, "mcs_kv_window_token_bytes": 4096, "mcs_kv_window_tokens": 128,
                      "mcs_kv_constant_bytes": 1 << 20}
    guessed = describe_info(msgspec.structs.replace(info, kv_measured=False))
    assert "(from the config: the caches were not measured)" in guessed
    no_limit = describe_info(Info(model="m", model_path="/m", context_length=1, ranks=1, backend="single",
                                  created=0, engine_pid=1))
    assert "KV memory no limit" in no_limit


def test_rank_0_budgets_with_every_ranks_measurement_and_falls_back_to_the_config_saying_why(caplog, tmp_path):
    from types import SimpleNamespace

    from config import load_settings
    from engine.__main__ import _kv_budget
    from ipc.messages import ModelFacts

    empty = tmp_path / "empty.env"
    empty.touch()
    settings = load_settings({"KV_MEMORY_BYTES": str(1 << 30), "PREFILL_TOKENS_PER_STEP": "256"}, empty)
    loaded = SimpleNamespace(facts=ModelFacts(config=QWEN3_4B, dtype="bfloat16"), pipeline_split=())
    rows = [[1, *KVMemory(640, 0, 0, 0).row()], [1, *KVMemory(320, 64, 128, 4096).row()]]
    kv, measured = _kv_budget(settings, loaded, 2, [], rows, 128)  # the chunk the ranks agreed on
    assert measured and kv == KVBudget(1 << 30, 640, 64, 128, 4096, 128)
    caplog.set_level("WARNING")
    kv, measured = _kv_budget(settings, loaded, 2, [], [rows[0], [0] * 9], 256)
    assert not measured and kv.token_bytes == token_bytes(QWEN3_4B, 2, "bfloat16") and not kv.constant_bytes
    assert "rank(s) [1] could not measure" in caplog.text


def test_status_names_how_the_ranks_split_the_model(info):
    from ops.status import describe_info

    def ranks_line(**kw) -> str:
        return [ln for ln in describe_info(msgspec.structs.replace(info, **kw)).splitlines() if "ranks" in ln][0]

    assert "pipeline parallel: layers 3 + 1" in ranks_line(ranks=2, backend="ring", parallel="pipeline",
                                                            pipeline_layers=[3, 1])
    assert "(tensor parallel)" in ranks_line(ranks=2, backend="ring", parallel="tensor")
    assert "parallel" not in ranks_line(parallel="single")


def test_metrics_and_health_show_the_live_buffers_against_their_budget(info):
    from api.health import details
    from api.metrics import _prefix_cache

    counted = msgspec.structs.replace(info, live_buffers=1234, live_buffers_budget=200000)
    values = {m.name: m.samples[0].value for m in _prefix_cache(counted)}
    assert (values["mcs_live_buffers"], values["mcs_live_buffers_budget"]) == (1234, 200000)
    cache = details(counted)["prompt_cache"]
    assert (cache["live_buffers"], cache["live_buffers_budget"]) == (1234, 200000)
