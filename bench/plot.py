"""The run's PNG: aggregate tokens/s and time to first token against concurrency.

Left: ours (blue) vs mlx_lm.server (orange), 1 rank solid, 2 ranks dashed, with the
in-process BatchGenerator ceilings as stars at their batch size. Right: TTFT p50 (line) and
p90 (band) for the same servers.
"""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from bench.report import shown, targets, verdict  # noqa: E402

STYLES = {  # key: (label, colour, line style, marker)
    "ours_1r": ("ours, 1 rank", "tab:blue", "-", "o"),
    "mlxlm_1r": ("mlx_lm.server, 1 rank", "tab:orange", "-", "s"),
    "ours_2r": ("ours, 2 ranks", "tab:blue", "--", "o"),
    "mlxlm_2r_pipe": ("mlx_lm.server, 2 ranks (stdin pipe)", "tab:orange", "--", "s"),
    "mlxlm_2r_plain": ("mlx_lm.server, 2 ranks (plain)", "tab:red", ":", "^"),
}


def write(res: dict, path: Path) -> None:
    servers, ceilings, meta = res.get("servers", {}), res.get("ceilings", {}), res["meta"]
    fig, (ax, bx) = plt.subplots(1, 2, figsize=(13, 6.2), dpi=110)
    levels = sorted({r["concurrency"] for e in servers.values() for r in e.get("sweep", [])}) or [1]

    for key, (label, colour, ls, marker) in STYLES.items():
        sweep = sorted(servers.get(key, {}).get("sweep", []), key=lambda r: r["concurrency"])
        if not sweep:
            continue
        xs = [r["concurrency"] for r in sweep]
        face = "white" if "2r" in key else colour  # 2 ranks: hollow markers
        ax.plot(xs, [r["aggregate_tps"] for r in sweep], ls=ls, marker=marker, color=colour, mfc=face, label=label)
        p50 = [1000 * r["ttft_p50_s"] for r in sweep]
        p90 = [1000 * r["ttft_p90_s"] for r in sweep]
        bx.plot(xs, p50, ls=ls, marker=marker, color=colour, mfc=face, label=f"{label} p50")
        bx.fill_between(xs, p50, p90, color=colour, alpha=0.12, lw=0)

    for key, label, colour, marker in (
            ("batchgen_1r", "in-process BatchGenerator, 1 rank", "black", "*"),
            ("batchgen_2r", "in-process BatchGenerator, 2 ranks", "dimgray", "*"),
            ("batchgen_plan_2r", "in-process BatchGenerator + plan broadcast each step, 2 ranks", "dimgray", "P")):
        e = ceilings.get(key)
        if e:
            ax.plot([e["sequences"]], [e["aggregate_tps"]], marker=marker, ms=14 if marker == "*" else 9, ls="none",
                    color=colour, label=label)
    for key, label, face in (("stream_generate_1r", "in-process stream_generate, 1 rank", "black"),
                             ("stream_generate_2r", "in-process stream_generate, 2 ranks", "white")):
        sg = ceilings.get(key)
        if sg:
            ax.plot([1], [sg["e2e_tps"]], marker="D", ms=8, ls="none", color="black", mfc=face, label=label)

    for a in (ax, bx):
        a.set_xscale("log", base=2)
        a.set_xlim(levels[0] / 1.4, levels[-1] * 1.4)
        a.set_xticks(levels)
        a.set_xticklabels([str(x) for x in levels])
        a.minorticks_off()
        a.set_xlabel("concurrent streaming requests")
        a.grid(True, which="major", alpha=0.3)
    ax.set_ylabel("aggregate completion tokens / s (best run)")
    ax.set_ylim(bottom=0)
    ax.set_title("Throughput (higher is better)")
    bx.set_ylabel("time to first token, ms (line p50, band up to p90)")
    bx.set_yscale("log")
    bx.set_title("Time to first token (lower is better)")

    verdicts = [f"{verdict(t):<5} {shown(t):>8} ({t['goal']}): {t['target']}" for t in targets(res)
                if t["pass"] is not None]
    if any(t["noisy"] for t in targets(res)):
        verdicts.append("* measured while other processes used the cores: noisy")
    height = 6.4 + 0.14 * len(verdicts)
    fig.set_size_inches(13, height)
    text_in = 0.12 + 0.14 * len(verdicts)
    fig.text(0.01, 0.1 / height, "\n".join(verdicts), fontsize=7.5, family="monospace", va="bottom")
    handles, labels = ax.get_legend_handles_labels()
    fig.legend(handles, labels, loc="lower center", ncol=3, fontsize=8, frameon=False,
               bbox_to_anchor=(0.5, (text_in + 0.05) / height))
    fig.suptitle(f"mlx-cluster-serve vs mlx-lm: {meta['model']}{' (quick)' if meta.get('quick') else ''}, "
                 f"max_tokens {meta['max_tokens']}, {meta['machine']} {meta['cpus']} CPUs, {meta['started']}",
                 fontsize=11)
    fig.subplots_adjust(left=0.06, right=0.98, top=1 - 0.75 / height, wspace=0.22,
                        bottom=(text_in + 0.8 + 0.55) / height)
    fig.savefig(path)
    plt.close(fig)
