"""The agent replay's PNG: time to first token per turn, prefix cache on vs off, one panel per rank count.

Each panel: TTFT on a log scale (cache on blue and solid, off orange and dashed), the cached share of
each turn's prompt as grey bars on the right axis, and the turn-2 ratio (best of the repetitions) in the title.
"""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from bench.report import num  # noqa: E402


def write(res: dict, path: Path) -> None:
    ranks = list(res["ranks"])
    fig, axes = plt.subplots(1, len(ranks), figsize=(6.5 * len(ranks), 4.8), dpi=110, squeeze=False, sharey=True)
    for ax, key in zip(axes[0], ranks):
        r = res["ranks"][key]
        rows = r["replay"]
        turns = [x["turn"] for x in rows]
        share = ax.twinx()
        share.bar(turns, [100 * x["cached_tokens"] / x["prompt_tokens"] for x in rows], color="0.85", width=0.6,
                  label="cached share of the prompt (cache on)")
        share.set_ylim(0, 100)
        share.set_ylabel("cached share of the prompt (%)")
        ax.set_zorder(share.get_zorder() + 1)
        ax.patch.set_visible(False)
        ax.plot(turns, [x["ttft_on_s"] for x in rows], "o-", color="tab:blue", label="TTFT, prefix cache on")
        ax.plot(turns, [x["ttft_off_s"] for x in rows], "s--", color="tab:orange", mfc="white",
                label="TTFT, prefix cache off")
        ax.set_yscale("log")
        ax.set_xticks(turns)
        ax.set_xlabel(f"turn (turn 1: {r['first_turn_tokens']} prompt tokens)")
        ax.set_ylabel("time to first token (s)")
        ax.grid(True, which="both", alpha=0.3)
        t2 = r["turn2"]
        ax.set_title(f"{key} rank{'s' if key != '1' else ''}: turn 2 cached/uncached = {num(t2['ratio'], '.3f')}"
                     f" (best of {len(t2['runs'])})", fontsize=10)
        lines, labels = ax.get_legend_handles_labels()
        bars, bar_labels = share.get_legend_handles_labels()
        ax.legend(lines + bars, labels + bar_labels, fontsize=8, loc="center right")
    fig.suptitle(f"Agent replay on {res['meta']['model']}: {len(rows)} turns, prefix cache on vs off", fontsize=11)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
