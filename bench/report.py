"""Markdown tables and the targets (PASS/MISS with the ratio or difference) from one run's results."""

from __future__ import annotations

import math
import operator

SERVERS = [  # results key, row label
    ("ours_1r", "ours, 1 rank"),
    ("mlxlm_1r", "mlx_lm.server, 1 rank"),
    ("ours_2r", "ours, 2 ranks"),
    ("mlxlm_2r_pipe", "mlx_lm.server, 2 ranks (stdin pipe)"),
    ("mlxlm_2r_plain", "mlx_lm.server, 2 ranks (plain)"),
]
# Idle parts only: the 4-rank engine started for its idle CPU and its first token after idle.
IDLE_SERVERS = [*SERVERS, ("ours_4r", "ours, 4 ranks")]
IDLE_TARGET = 2.0  # % of one core, per process
WAKE_TARGET_MS = 50.0  # first token after idle minus a warm one
OPS = {">=": operator.ge, "<=": operator.le, "<": operator.lt}


def num(x, spec: str = ".1f") -> str:
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "–"
    return format(x, spec)


def both(best, median) -> str:
    """`best (median)` over the runs, or just the value when there was one run."""
    if median is None or best is None or (isinstance(median, float) and math.isnan(median)) or \
            abs(best - median) < 1e-9:
        return num(best)
    return f"{num(best)} ({num(median)})"


def table(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(lines)


def at(entry: dict | None, c: int) -> dict | None:
    for r in (entry or {}).get("sweep", []):
        if r["concurrency"] == c:
            return r
    return None


def get(d: dict | None, *path, default=None):
    for k in path:
        if not isinstance(d, dict) or k not in d:
            return default
        d = d[k]
    return d


def ceiling_2r(ceilings: dict) -> dict | None:
    """Both in-process 2-rank runs bound what 2 ranks can do (the second only adds a broadcast per
    step), so the faster of the two is the ceiling: the one a busy host disturbed less."""
    return max((e for e in (ceilings.get("batchgen_2r"), ceilings.get("batchgen_plan_2r")) if e),
               key=lambda e: e["aggregate_tps"], default=None)


def _finite(x) -> bool:
    return isinstance(x, (int, float)) and not math.isnan(x)


def targets(res: dict) -> list[dict]:
    """Each target: ours, the reference, the value checked (a ratio, or a difference or a percentage with its
    unit), the goal and the verdict (None when not measured); noisy when either side's best run shared the
    host with other processes' load."""
    s, c = res.get("servers", {}), res.get("ceilings", {})
    quiet = res["meta"].get("quiet_threshold", 0.5)
    out = []

    def loaded(*entries) -> bool:
        return any(_finite(x) and x >= quiet for x in (get(e, "other_load_cores") for e in entries))

    def add(name, ours, ref, value, goal, op, noisy, unit=""):
        ok = OPS[op](value, goal) if _finite(value) else None
        out.append({"target": name, "ours": ours, "reference": ref, "ratio": value if not unit else None,
                    "value": value, "unit": unit, "goal": f"{op} {goal:g}{unit}", "pass": ok, "noisy": noisy})

    def ratio(name, ours_entry, ours_key, ref_entry, ref_key, goal, op=">=", scale=1.0):
        ours, ref = get(ours_entry, ours_key), get(ref_entry, ref_key)
        value = ours / ref if _finite(ours) and _finite(ref) and ref else None
        add(name, ours * scale if _finite(ours) else None, ref * scale if _finite(ref) else None, value, goal, op,
            loaded(ours_entry, ref_entry))

    ours1, mlx1, ours2 = s.get("ours_1r"), s.get("mlxlm_1r"), s.get("ours_2r")
    ratio("1 rank: single-stream decode tok/s, HTTP vs in-process mlx_lm.stream_generate",
          get(ours1, "single"), "decode_tps_best", c.get("stream_generate_1r"), "decode_tps", 0.95)
    ratio("1 rank: aggregate tok/s at c=8 vs in-process BatchGenerator(8)",
          at(ours1, 8), "aggregate_tps", c.get("batchgen_1r"), "aggregate_tps", 0.97)
    ratio("1 rank: aggregate tok/s at c=32 vs mlx_lm.server",
          at(ours1, 32), "aggregate_tps", at(mlx1, 32), "aggregate_tps", 1.1)
    ratio("1 rank: TTFT ms p50, one short request at a time, vs mlx_lm.server",
          get(ours1, "ttft"), "ttft_p50_s", get(mlx1, "ttft"), "ttft_p50_s", 1.0, "<=", scale=1000.0)
    ratio("2 ranks: aggregate tok/s at c=8 vs in-process 2-rank BatchGenerator(8) (faster of with/without "
          "per-step plan broadcast)", at(ours2, 8), "aggregate_tps", ceiling_2r(c), "aggregate_tps", 0.95)
    ratio("2 ranks: aggregate tok/s at c=8 vs mlx_lm.server started the same way (stdin pipe)",
          at(ours2, 8), "aggregate_tps", at(s.get("mlxlm_2r_pipe"), 8), "aggregate_tps", 1.0)
    ratio("2 ranks: single-stream decode tok/s, HTTP vs in-process 2-rank mlx_lm.stream_generate",
          get(ours2, "single"), "decode_tps_best", c.get("stream_generate_2r"), "decode_tps", 0.9)
    ranks, idle = next(((k, v) for k, v in s.items() if k.startswith("ours_") and "wake" in v), ("ours_4r", {}))
    n = ranks.removeprefix("ours_").removesuffix("r")
    cpu = idle.get("idle_cpu") or {}
    if cpu:
        worst = max(cpu.items(), key=lambda kv: kv[1] if _finite(kv[1]) else math.inf)
        add(f"{n} ranks idle: busiest process ({worst[0]}), % of one core", worst[1], None, worst[1], IDLE_TARGET,
            "<", False, " %")
    else:
        add(f"{n} ranks idle: busiest process, % of one core", None, None, None, IDLE_TARGET, "<", False, " %")
    wake = idle.get("wake") or {}
    add(f"{n} ranks: TTFT ms p50 after {num(wake.get('gap_s'), 'g')} s idle minus right after another request",
        1000 * wake["cold_p50_s"] if wake else None, 1000 * wake["warm_p50_s"] if wake else None,
        wake.get("diff_p50_ms"), WAKE_TARGET_MS, "<=", loaded(wake), " ms")
    return out


def verdict(t: dict) -> str:
    return "–" if t["pass"] is None else ("PASS" if t["pass"] else "MISS") + ("*" if t["noisy"] else "")


def shown(t: dict) -> str:
    """The checked value: a ratio, or a difference in ms, or a percentage."""
    v = t["value"]
    if not _finite(v):
        return "–"
    return f"{v:+.0f} ms" if t["unit"] == " ms" else f"{v:.1f} %" if t["unit"] == " %" else f"{v:.3f}"


def markdown(res: dict) -> str:
    m, s, c = res["meta"], res.get("servers", {}), res.get("ceilings", {})
    parts = [f"## mlx-cluster-serve benchmark: {m['model']}{' (quick)' if m.get('quick') else ''}",
             f"{m['started']} on {m['host']} ({m['machine']}, {m['cpus']} CPUs), mlx {m['mlx']}, mlx-lm {m['mlx_lm']}, "
             f"git {m['git']}; max_tokens {m['max_tokens']}, EOS {m['eos_token_ids']} suppressed by logit_bias -100, "
             f"greedy; our PREFILL_TOKENS_PER_STEP {m['prefill_tokens_per_step']}. `other load` = cores busy with processes "
             "outside this benchmark during the best run of a cell."]

    def stream_row(label: str, sg: dict | None) -> list[str]:
        return [label, str(len(get(sg, "runs", default=[]))), both(get(sg, "decode_tps"), get(sg, "decode_tps_median")),
                num(get(sg, "e2e_tps")), num(1000 * get(sg, "ttft_p50_s", default=math.nan), ".0f"),
                num(get(sg, "other_load_cores"), ".2f")]

    def http_row(key: str) -> list[str]:
        r = get(s, key, "single")
        return [f"{dict(SERVERS)[key]} (HTTP stream)", str(get(r, "requests", default="–")),
                both(get(r, "decode_tps_best"), get(r, "decode_tps_p50")), num(get(r, "e2e_tps_p50")),
                num(1000 * get(r, "ttft_p50_s", default=math.nan), ".0f"), num(get(r, "other_load_cores"), ".2f")]

    rows = [stream_row("mlx_lm.stream_generate, 1 rank (in-process)", c.get("stream_generate_1r"))]
    b1 = c.get("batchgen1_1r")
    if b1:
        rows.append(["mlx_lm BatchGenerator(1), 1 rank (in-process; what both servers run)", str(len(b1["runs"])),
                     both(b1.get("decode_tps"), b1.get("decode_tps_median")), num(b1.get("aggregate_tps")), "–",
                     num(b1.get("other_load_cores"), ".2f")])
    rows += [http_row("ours_1r"), http_row("mlxlm_1r")]
    if c.get("stream_generate_2r") or get(s, "ours_2r", "single"):
        rows += [stream_row("mlx_lm.stream_generate, 2 ranks (in-process, sharded, under mlx.launch)",
                            c.get("stream_generate_2r")), http_row("ours_2r")]
    parts += ["### 1. Single stream",
              table(["", "runs", "decode tok/s best (median)", "end-to-end tok/s", "TTFT ms p50", "other load"],
                    rows)]

    rows = []
    for key in ("ours_1r", "mlxlm_1r", "ours_2r"):
        r = get(s, key, "ttft")
        if r:
            rows.append([dict(SERVERS)[key], str(r["requests"]), num(1000 * r["ttft_p50_s"], ".0f"),
                         num(1000 * r["ttft_p90_s"], ".0f"), num(r.get("other_load_cores"), ".2f")])
    parts += ["### 2. Time to first token, one request at a time (short prompts, streaming)",
              table(["server", "requests", "p50 ms", "p90 ms", "other load"], rows)]

    levels = sorted({r["concurrency"] for e in s.values() for r in e.get("sweep", [])})
    rows, trows = [], []
    for key, label in SERVERS:
        e = s.get(key)
        if not e:
            continue
        cells = [at(e, lv) for lv in levels]
        load = max((x.get("other_load_cores", 0) for x in cells if x), default=math.nan)
        errs = sum(x["errors"] for x in cells if x)
        retries = sum(x.get("retries", 0) for x in cells if x)
        rows.append([label] + [both(get(x, "aggregate_tps"), get(x, "aggregate_tps_median")) for x in cells]
                    + [num(load, ".2f"), f"{errs} ({retries})"])
        trows.append([label] + [f"{num(1000 * get(x, 'ttft_p50_s', default=math.nan), '.0f')} / "
                                f"{num(1000 * get(x, 'ttft_p90_s', default=math.nan), '.0f')}" if x else "–"
                                for x in cells])
    for key, label in (("batchgen_1r", "in-process BatchGenerator, 1 rank"),
                       ("batchgen_2r", "in-process BatchGenerator, 2 ranks"),
                       ("batchgen_plan_2r", "in-process BatchGenerator + plan broadcast every step, 2 ranks")):
        e = c.get(key)
        if e:
            rows.append([label] + [both(e["aggregate_tps"], e.get("aggregate_tps_median")) if lv == e["sequences"]
                                   else "" for lv in levels]
                        + [num(e.get("other_load_cores"), ".2f"), ""])
    crows = []
    for key, label in SERVERS:
        if s.get(key):
            crows.append([label] + [num(get(at(s[key], lv), "server_cpu_ms_per_token"), ".2f") for lv in levels])
    for key, label in (("batchgen_1r", "in-process BatchGenerator, 1 rank"),
                       ("batchgen_2r", "in-process BatchGenerator, 2 ranks"),
                       ("batchgen_plan_2r", "in-process BatchGenerator + plan broadcast every step, 2 ranks")):
        e = c.get(key)
        if e and "cpu_ms_per_token" in e:
            crows.append([label] + [num(e["cpu_ms_per_token"], ".2f") if lv == e["sequences"] else ""
                                    for lv in levels])
    hdr = ["server"] + [f"c={lv}" for lv in levels]
    prows = []
    for key, label in SERVERS:
        for lv in (1, 8):
            by = get(at(s.get(key), lv), "server_cpu_ms_per_token_by_process") or {}
            if by:
                prows.append([label, str(lv)] + [", ".join(f"{k} {v:.2f}" for k, v in sorted(by.items()))])
    parts += ["### 3–4. Aggregate tokens/s by concurrency, best run (median): completion tokens from `usage` / "
              "wall time of one wave of c streaming requests",
              table(hdr + ["other load (worst cell)", "errors (retries)"], rows),
              "TTFT p50 / p90 ms by concurrency:", table(hdr, trows),
              "CPU ms per generated token, all the server's processes (ranks, launcher, API) summed; "
              "unlike tokens/s it hardly moves when other processes compete for the cores:",
              table(hdr, crows),
              "The same by process (CPU ms per generated token):",
              table(["server", "c", "processes"], prows)]

    pc = res.get("plan_cost")
    if pc:
        step8 = get(ceiling_2r(c), "decode_step_ms")
        ours8 = get(at(s.get("ours_2r"), 8), "aggregate_tps")
        ours_step = 1000 * 8 / ours8 if ours8 else None
        rows = [[str(r["rank"]), num(r["p50_us"], ".0f"), num(r["p90_us"], ".0f"), num(r["mean_us"], ".0f"),
                 num(100 * r["p50_us"] / 1000 / step8, ".2f") + " %" if step8 else "–",
                 num(100 * r["p50_us"] / 1000 / ours_step, ".2f") + " %" if ours_step else "–"]
                for r in pc["per_rank"]]
        parts += [f"### 5. Plan broadcast, 2 ranks: `PlanChannel.broadcast` of a decode plan ({pc['plan_bytes']} bytes "
                  f"encoded, {pc['buffer_bytes']}-byte buffer, {pc['collectives_per_call']:g} all_sum per call, "
                  f"{pc['calls']} calls)",
                  table(["rank", "p50 µs", "p90 µs", "mean µs",
                         f"p50 / ceiling step ({num(step8)} ms, 8 seqs)",
                         f"p50 / our step at c=8 ({num(ours_step)} ms)"], rows)]

    pre = get(s, "ours_1r", "prefill")
    if pre:
        parts += ["### 6. Prefill interference, ours, 1 rank",
                  table(["PREFILL_TOKENS_PER_STEP", "8 × 1000-token TTFT p50 ms", "max ms", "30-token TTFT ms",
                         "ratio", "sent during their prefill", "errors"],
                        [[str(pre["prefill_tokens_per_step"]), num(1000 * pre["long_ttft_p50_s"], ".0f"),
                          num(1000 * pre["long_ttft_max_s"], ".0f"), num(1000 * pre["short_ttft_s"], ".0f"),
                          num(pre["ratio"], ".2f"), "yes" if pre["short_sent_during_prefill"] else "NO (invalid)",
                          str(len(pre["errors"]))]])]

    rows = []
    for key, label in IDLE_SERVERS:
        e = s.get(key) or {}
        window = e.get("idle_window_s")
        for proc, pct in (e.get("idle_cpu") or {}).items():
            how = f"{len(e['idle_cpu_windows'])} × {window:g} s" if window else "one window"
            rows.append([label, proc, num(pct, ".1f"), how, "–" if not _finite(pct) else
                         "PASS" if pct < IDLE_TARGET else "MISS"])
    if rows:
        parts += [f"### 7. Idle CPU (% of one core over the idle windows, from /proc/<pid>/stat; each window "
                  f"starts {m.get('idle_settle_s', 2.0):g} s after the last request ended)",
                  table(["server", "process", "% core", "windows", f"< {IDLE_TARGET:g} %"], rows)]

    for key, label in IDLE_SERVERS:
        w = get(s, key, "wake")
        if not w:
            continue
        rows = [[f"after {w['gap_s']:g} s idle", str(len(w["cold_ttft_s"])), num(1000 * w["cold_p50_s"], ".1f"),
                 num(1000 * w["cold_best_s"], ".1f"), " ".join(f"{1000 * x:.0f}" for x in w["cold_ttft_s"])],
                ["right after another request ended", str(len(w["warm_ttft_s"])), num(1000 * w["warm_p50_s"], ".1f"),
                 num(1000 * w["warm_best_s"], ".1f"), " ".join(f"{1000 * x:.0f}" for x in w["warm_ttft_s"])]]
        parts += [f"### 8. First token after idle, {label} (short chat requests, `max_tokens` 4, one at a time)",
                  table(["sent", "requests", "TTFT p50 ms", "best ms", "all ms"], rows),
                  f"Difference: p50 {num(w['diff_p50_ms'], '+.1f')} ms, best {num(w['diff_best_ms'], '+.1f')} ms "
                  f"(target: p50 ≤ {WAKE_TARGET_MS:g} ms); errors {w['error_count']}; other load "
                  f"{num(w['other_load_cores'], '.2f')} cores (worst round)."]

    def short(x) -> str:  # 3 significant digits, without an exponent for the ms of a slow TTFT
        return num(x, ".0f" if _finite(x) and abs(x) >= 1000 else ".3g")

    rows = [[t["target"], short(t["ours"]), short(t["reference"]), shown(t), t["goal"], verdict(t)]
            for t in targets(res)]
    parts += ["### Targets", table(["target", "ours", "reference", "ratio or difference", "goal", "result"], rows),
              f"Best run against best run (TTFT: p50 against p50). `*`: other processes used ≥ "
              f"{m.get('quiet_threshold', 0.5):g} cores during one side's best run, so the result carries their "
              "noise; re-run on a quieter host."]

    if res.get("failures"):
        parts += ["### Failed parts", "\n".join(f"- {k}: {v.splitlines()[0] if v else ''}"
                                                for k, v in res["failures"].items())]
    return "\n\n".join(parts)
