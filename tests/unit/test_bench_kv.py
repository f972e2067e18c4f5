"""The KV-quantization benchmarks' arithmetic: the KL bound, the position buckets, the bytes a token takes."""

import math

import pytest

from bench.kv_quality import Config, Scores, buckets, kl_top, same_prefix, summary
from bench.kv_speed import kv_token_bytes, read_per_token


def test_kl_top_is_zero_for_the_same_distribution_and_bounds_the_full_kl():
    p = {"a": math.log(0.6), "b": math.log(0.3)}
    assert kl_top(p, p) == pytest.approx(0.0, abs=1e-12)
    # full distributions: p = (.6, .3, .08, .02), q = (.5, .3, .02, .18); listing two tokens merges the others
    q = {"a": math.log(0.5), "b": math.log(0.3)}
    full = 0.6 * math.log(0.6 / 0.5) + 0.08 * math.log(0.08 / 0.02) + 0.02 * math.log(0.02 / 0.18)
    assert kl_top(p, q) == pytest.approx(0.6 * math.log(0.6 / 0.5) + 0.1 * math.log(0.1 / 0.2))
    assert kl_top(p, q) < full


def test_kl_top_gives_a_token_the_other_side_does_not_list_at_most_its_smallest_probability():
    p = {"a": math.log(0.5), "c": math.log(0.4)}
    q = {"a": math.log(0.5), "b": math.log(0.45)}  # "c" absent: at most 0.45
    assert kl_top(p, q) == pytest.approx(0.4 * math.log(0.4 / 0.45) + 0.1 * math.log(0.1 / 0.05))


def test_buckets_and_summary():
    assert buckets(3000, [0, 512, 2048]) == [(0, 512), (512, 2048), (2048, 3000)]
    assert buckets(300, [0, 512, 2048]) == [(0, 300)]
    s = Scores(kl=[0.0, 0.2, 0.1, 0.3], agree=[True, False, True, True], logprob=[-1.0, -1.0, -2.0, -2.0])
    kl, p99, agree, ppl = summary(s, 2, 4)
    assert (kl, p99, agree) == pytest.approx((0.2, 0.3, 1.0))
    assert ppl == pytest.approx(math.exp(2.0))
    assert same_prefix([1, 2, 3], [1, 2, 4, 5]) == 2


def test_config_names_and_settings():
    assert Config.parse("off").env() == {"KV_BITS": "off", "KV_GROUP_SIZE": "64"}
    assert Config.parse("4/32") == Config(4, 32) and str(Config(8)) == "8 bits / 64"


def test_quantized_bytes_per_token_are_what_the_bits_say():
    # SmolLM2-135M's shape: 30 layers, 3 KV heads of 64; in float16, one float16 scale and bias a group
    f16 = kv_token_bytes(30, 3, 64, 2, Config(None))
    assert f16 == 23040
    assert kv_token_bytes(30, 3, 64, 2, Config(8, 64)) / f16 == pytest.approx(0.53125)
    assert kv_token_bytes(30, 3, 64, 2, Config(4, 64)) / f16 == pytest.approx(0.28125)
    # in float32 (as SmolLM2 computes) the scales are float32 too: 12960 bytes a token at 8 bits
    assert kv_token_bytes(30, 3, 64, 4, Config(8, 64)) == 12960
    # the weights are read once a step for the whole batch
    assert read_per_token(800, 10.0, 100, 8) == 100 + 1000
    # the first positions kept exact: in process only, the engine has no such setting
    assert Config.parse("4/64@256") == Config(4, 64, 256) and str(Config(4, 64, 256)) == "4 bits / 64, first 256 exact"
    with pytest.raises(SystemExit, match="--way inprocess"):
        Config(4, 64, 256).env()
