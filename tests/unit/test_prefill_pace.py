"""The prefill chunk rule (engine/prefill_pace.py): paced to the slowest rank, under the watchdog's deadline."""

from engine.prefill_pace import Pace, agree, paced_chunk, row


def test_a_fast_host_prefills_the_whole_ceiling():
    # a Mac GPU: 0.1 ms a token, 512 tokens in 51 ms
    assert paced_chunk(1e-4, 30.0, 512) == 512
    assert paced_chunk(1e-4, 30.0, 300) == 300  # a ceiling that is not a power of two is kept as set


def test_a_slow_host_prefills_the_largest_power_of_two_within_a_quarter_of_the_deadline():
    # MLX's CPU build on SmolLM2-135M: about 7 tokens/s, so 7.5 s of a 30 s deadline holds 52 tokens
    assert paced_chunk(1 / 7, 30.0, 512) == 32
    assert paced_chunk(1 / 7, 120.0, 512) == 128  # a longer WATCHDOG_TIMEOUT, a longer chunk
    assert paced_chunk(1 / 7, 120.0, 100) == 100  # never above PREFILL_TOKENS_PER_STEP, kept where it fits


def test_even_a_host_too_slow_for_sixteen_tokens_prefills_sixteen_and_an_unmeasured_rate_keeps_the_ceiling():
    assert paced_chunk(1.0, 5.0, 512) == 16
    assert paced_chunk(0.0, 30.0, 512) == 512


def test_every_rank_takes_the_slowest_ranks_rate():
    rows = [row(1e-4), row(1 / 7), row(0.0)]  # rank 2 could not measure: the others still pace
    assert rows[2] == [0]
    pace = agree(rows, 30.0, 512)
    assert pace.chunk == 32 and round(pace.tokens_per_second) == 7
    assert agree([row(0.0)], 30.0, 512) == Pace(512, 0.0)  # one rank, unmeasured


def test_status_and_health_show_the_chunk_and_the_rate():
    from api.health import details
    from ipc import Info
    from ops.status import describe_info

    info = Info(model="m", model_path="/m", context_length=4096, ranks=1, backend="single", created=0, engine_pid=1,
                prefill_chunk=32, prefill_tokens_per_second=7.25)
    assert "  prefill   32 prompt tokens per step (the slowest rank prefills 7.2 tokens/s)" in describe_info(info)
    assert details(info)["prefill"] == {"tokens_per_step": 32, "tokens_per_second": 7.25}
