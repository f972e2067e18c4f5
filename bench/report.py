"""Markdown tables and the issue-3 targets (PASS/MISS with the ratio) from one run's results."""

from __future__ import annotations

import math

SERVERS = [  # results key, row label
    ("ours_1r", "ours, 1 rank"),
    ("mlxlm_1r", "mlx_lm.server, 1 rank"),
    ("ours_2r", "ours, 2 ranks"),
    ("mlxlm_2r_pipe", "mlx_lm.server, 2 ranks (stdin pipe)"),
    ("mlxlm_2r_plain", "mlx_lm.server, 2 ranks (plain)"),
]
IDLE_TARGET = 10.0  # % of one core, per process


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


def targets(res: dict) -> list[dict]:
    """Each issue-3 target: measured value, reference, ratio, goal, verdict (None when not measured)."""
    s, c = res.get("servers", {}), res.get("ceilings", {})
    out = []

    quiet = res["meta"].get("quiet_threshold", 0.5)

    def add(name, ours_entry, ours_key, ref_entry, ref_key, goal, op=">="):
        ours, ref = get(ours_entry, ours_key), get(ref_entry, ref_key)
        ratio = ours / ref if ours is not None and ref and not math.isnan(ours) and not math.isnan(ref) else None
        ok = None if ratio is None else (ratio >= goal if op == ">=" else ratio < goal)
        loads = [get(e, "other_load_cores", default=0.0) for e in (ours_entry, ref_entry)]
        out.append({"target": name, "ours": ours, "reference": ref, "ratio": ratio, "goal": f"{op} {goal:g}",
                    "pass": ok, "noisy": max(loads) >= quiet})

    add("1 rank: single-stream decode tok/s, HTTP vs mlx_lm.stream_generate",
        get(s, "ours_1r", "single"), "decode_tps_best", c.get("stream_generate_1r"), "decode_tps", 0.95)
    add("1 rank: aggregate tok/s at c=8 vs in-process BatchGenerator(8)",
        at(s.get("ours_1r"), 8), "aggregate_tps", c.get("batchgen_1r"), "aggregate_tps", 0.95)
    add("1 rank: aggregate tok/s at c=8 vs mlx_lm.server",
        at(s.get("ours_1r"), 8), "aggregate_tps", at(s.get("mlxlm_1r"), 8), "aggregate_tps", 1.0)
    add("2 ranks: aggregate tok/s at c=8 vs in-process 2-rank BatchGenerator(8) (faster of with/without "
        "per-step plan broadcast)",
        at(s.get("ours_2r"), 8), "aggregate_tps", ceiling_2r(c), "aggregate_tps", 0.9)
    add("2 ranks: aggregate tok/s at c=8 vs mlx_lm.server started the same way (stdin pipe)",
        at(s.get("ours_2r"), 8), "aggregate_tps", at(s.get("mlxlm_2r_pipe"), 8), "aggregate_tps", 1.5)
    pre = get(s, "ours_1r", "prefill")
    if pre:
        out.append({"target": f"TTFT of a {pre['short_prompt_tokens']}-token prompt during eight "
                              f"{pre['long_prompt_tokens']}-token prefills / their TTFT",
                    "ours": pre["short_ttft_s"], "reference": pre["long_ttft_p50_s"], "ratio": pre["ratio"],
                    "goal": "< 0.333", "pass": pre["ratio"] < 1 / 3 if pre["short_sent_during_prefill"] else None,
                    "noisy": pre.get("other_load_cores", 0.0) >= quiet})
    idle = get(s, "ours_2r", "idle_cpu")
    if idle:
        worst = max(idle.items(), key=lambda kv: -1 if math.isnan(kv[1]) else kv[1])
        out.append({"target": f"2 ranks idle: busiest process ({worst[0]}) % of one core", "ours": worst[1],
                    "reference": None, "ratio": None, "goal": f"< {IDLE_TARGET:g} %", "pass": worst[1] < IDLE_TARGET,
                    "noisy": False})
    return out


def markdown(res: dict) -> str:
    m, s, c = res["meta"], res.get("servers", {}), res.get("ceilings", {})
    parts = [f"## mlx-cluster-serve benchmark: {m['model']}{' (quick)' if m.get('quick') else ''}",
             f"{m['started']} on {m['host']} ({m['machine']}, {m['cpus']} CPUs), mlx {m['mlx']}, mlx-lm {m['mlx_lm']}, "
             f"git {m['git']}; max_tokens {m['max_tokens']}, EOS {m['eos_token_ids']} suppressed by logit_bias -100, "
             f"greedy; our PREFILL_TOKENS_PER_STEP {m['prefill_tokens_per_step']}. `other load` = cores busy with processes "
             "outside this benchmark during the best run of a cell."]

    sg = c.get("stream_generate_1r")
    rows = [["mlx_lm.stream_generate (in-process)", str(len(get(sg, "runs", default=[]))),
             both(get(sg, "decode_tps"), get(sg, "decode_tps_median")), num(get(sg, "e2e_tps")),
             num(1000 * get(sg, "ttft_p50_s", default=math.nan), ".0f"), num(get(sg, "other_load_cores"), ".2f")]]
    b1 = c.get("batchgen1_1r")
    if b1:
        rows.append(["mlx_lm BatchGenerator(1) (in-process; what both servers run)", str(len(b1["runs"])),
                     both(b1.get("decode_tps"), b1.get("decode_tps_median")), num(b1.get("aggregate_tps")), "–",
                     num(b1.get("other_load_cores"), ".2f")])
    for key in ("ours_1r", "mlxlm_1r"):
        r = get(s, key, "single")
        rows.append([f"{dict(SERVERS)[key]} (HTTP stream)", str(get(r, "requests", default="–")),
                     both(get(r, "decode_tps_best"), get(r, "decode_tps_p50")), num(get(r, "e2e_tps_p50")),
                     num(1000 * get(r, "ttft_p50_s", default=math.nan), ".0f"), num(get(r, "other_load_cores"), ".2f")])
    parts += ["### 1. Single stream, 1 rank",
              table(["", "runs", "decode tok/s best (median)", "end-to-end tok/s", "TTFT ms p50", "other load"],
                    rows)]

    rows = []
    for key in ("ours_1r", "mlxlm_1r"):
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
    for key, label in SERVERS:
        for proc, pct in (get(s, key, "idle_cpu") or {}).items():
            rows.append([label, proc, num(pct, ".1f"), "PASS" if pct < IDLE_TARGET else "MISS"])
    if rows:
        parts += ["### 7. Idle CPU (% of one core over the idle window, from /proc/<pid>/stat)",
                  table(["server", "process", "% core", f"< {IDLE_TARGET:g} %"], rows)]

    rows = []
    for t in targets(res):
        verdict = "–" if t["pass"] is None else ("PASS" if t["pass"] else "MISS") + ("*" if t["noisy"] else "")
        rows.append([t["target"], num(t["ours"], ".3g"), num(t["reference"], ".3g"), num(t["ratio"], ".3f"),
                     t["goal"], verdict])
    parts += ["### Targets (issue 3)", table(["target", "ours", "reference", "ratio", "goal", "result"], rows),
              f"Best run against best run. `*`: other processes used ≥ {m.get('quiet_threshold', 0.5):g} cores "
              "during one side's best run, so the ratio carries their noise; re-run on a quieter host."]

    if res.get("failures"):
        parts += ["### Failed parts", "\n".join(f"- {k}: {v.splitlines()[0] if v else ''}"
                                                for k, v in res["failures"].items())]
    return "\n\n".join(parts)
