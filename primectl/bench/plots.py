"""PNG plots (matplotlib, Agg backend): per-run latency, knee search, A/B deltas and Pareto."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

if TYPE_CHECKING:
    from primectl.bench.sla import KneeResult


def bench_plots(records: list[dict[str, Any]], out: Path, *, title: str) -> list[Path]:
    """latency.png (TTFT and ITL distributions) and turns.png (TTFT and prompt size by turn)."""
    out.mkdir(parents=True, exist_ok=True)
    ok = [r for r in records if not r.get("error")]
    ttft = [r["time_to_first_token"] for r in ok if r.get("time_to_first_token") is not None]
    itl = [r["inter_token_latency"] for r in ok if r.get("inter_token_latency") is not None]
    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    for ax, data, name in ((axes[0], ttft, "time to first token (ms)"), (axes[1], itl, "inter-token latency (ms)")):
        if data:
            ax.hist(data, bins=30, color="#4477aa")
        ax.set_xlabel(name)
        ax.set_ylabel("requests")
    fig.suptitle(f"{title}: {len(ok)} requests")
    fig.tight_layout()
    latency = out / "latency.png"
    fig.savefig(latency, dpi=100)
    plt.close(fig)

    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(10, 4))
    sess = [r for r in ok if r.get("turn_index") is not None and not str(r.get("conversation_id", "")).startswith("cold")]
    cold = [r for r in ok if str(r.get("conversation_id", "")).startswith("cold")]
    ax1.scatter([r["turn_index"] for r in sess], [r.get("time_to_first_token") for r in sess], s=8, label="sessions")
    if cold:
        ax1.scatter([-0.5] * len(cold), [r.get("time_to_first_token") for r in cold], s=8, c="#cc6677",
                    label="cold prompts (x=-0.5)")
    ax1.set_xlabel("turn")
    ax1.set_ylabel("TTFT (ms)")
    ax1.legend(fontsize=8)
    ax2.scatter([r["turn_index"] for r in sess], [r.get("input_sequence_length") for r in sess], s=8)
    ax2.set_xlabel("turn")
    ax2.set_ylabel("prompt tokens (server count)")
    fig.suptitle(f"{title}: history grows each turn")
    fig.tight_layout()
    turns = out / "turns.png"
    fig.savefig(turns, dpi=100)
    plt.close(fig)
    return [latency, turns]


def knee_plot(result: KneeResult, path: Path) -> list[Path]:
    """The SLA metric at each probed concurrency, passes and fails marked, the SLA as a line."""
    fig, ax = plt.subplots(figsize=(6, 4))
    probes = sorted(result.probes, key=lambda p: p.concurrency)
    xs = [p.concurrency for p in probes if p.value is not None]
    ys = [p.value for p in probes if p.value is not None]
    ax.plot(xs, ys, color="#999999", zorder=1)
    for p in probes:
        if p.value is not None:
            ax.scatter([p.concurrency], [p.value], c="#228833" if p.passed else "#cc3311", zorder=2)
    ax.axhline(result.sla.value, linestyle="--", color="#333333", label=str(result.sla))
    if result.knee is not None:
        ax.axvline(result.knee, linestyle=":", color="#228833", label=f"knee: {result.knee}")
    ax.set_xlabel("concurrency (sessions)")
    ax.set_ylabel(result.sla.metric)
    ax.legend(fontsize=8)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return [path]


def ab_plots(rows: list[dict[str, Any]], runs: list[tuple[str, int, dict[str, Any]]], out: Path) -> list[Path]:
    """ab.png (A and B per metric, mean with stdev bars) and pareto.png (tok/s/user vs output tok/s/GPU)."""
    shown = [r for r in rows if r["a_mean"] is not None and r["b_mean"] is not None]
    n = max(len(shown), 1)
    cols = min(n, 5)
    nrows = (n + cols - 1) // cols
    fig, axes = plt.subplots(nrows, cols, figsize=(3 * cols, 3 * nrows), squeeze=False)
    for ax, r in zip(axes.flat, shown, strict=False):
        ax.bar(["A", "B"], [r["a_mean"], r["b_mean"]], yerr=[r["a_stdev"] or 0, r["b_stdev"] or 0],
               color=["#4477aa", "#ee6677"], capsize=4)
        ax.set_title(f"{r['metric']}\n{r['significant']}", fontsize=8)
        ax.tick_params(labelsize=7)
    for ax in list(axes.flat)[len(shown):]:
        ax.axis("off")
    fig.tight_layout()
    ab = out / "ab.png"
    fig.savefig(ab, dpi=100)
    plt.close(fig)

    fig, ax = plt.subplots(figsize=(6, 4))
    for label, color in (("A", "#4477aa"), ("B", "#ee6677")):
        pts: list[tuple[float, float, int]] = [
            (float(f["tok_s_per_user"]), float(f["output_tok_s_per_gpu"]), i) for lab, i, f in runs
            if lab == label and f.get("tok_s_per_user") is not None and f.get("output_tok_s_per_gpu") is not None]
        ax.scatter([p[0] for p in pts], [p[1] for p in pts], c=color, label=label)
        for x, y, i in pts:
            ax.annotate(f"{label}{i}", (x, y), fontsize=7)
    ax.set_xlabel("tok/s per user (interactivity)")
    ax.set_ylabel("output tok/s per GPU (efficiency)")
    ax.set_title("Pareto: up and to the right is better")
    ax.legend()
    fig.tight_layout()
    pareto = out / "pareto.png"
    fig.savefig(pareto, dpi=100)
    plt.close(fig)
    return [ab, pareto]


def frontier_plot(curves: list[tuple[str, list[tuple[int, float, float]], list[tuple[float, float]],
                                    list[tuple[float, float]]]], path: Path, *, title: str,
                  x_sla: float | None = None) -> list[Path]:
    """Output tok/s per GPU against tok/s per user, one curve per variant.

    Each curve: (label, per-concurrency means (c, x, y), every probe (x, y), each repeat's knee (x, y)). The line
    joins the means in concurrency order; faint dots are single probes; stars are knees. The SLA is a vertical
    line when it bounds tok/s per user.
    """
    fig = frontier_figure(curves, title=title, x_sla=x_sla)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return [path]


def frontier_figure(curves: list[tuple[str, list[tuple[int, float, float]], list[tuple[float, float]],
                                      list[tuple[float, float]]]], *, title: str, x_sla: float | None = None) -> Any:
    """The frontier plot's figure. Both axes start at zero: variants a few percent apart look a few percent
    apart, not spread over the whole plot."""
    fig, ax = plt.subplots(figsize=(7, 4.5))
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for n, (label, means, raw, knees) in enumerate(curves):
        color = colors[n % len(colors)]
        ax.scatter([p[0] for p in raw], [p[1] for p in raw], s=10, color=color, alpha=0.35)
        ax.plot([p[1] for p in means], [p[2] for p in means], marker="o", ms=4, color=color, label=label)
        for c, x, y in means:
            ax.annotate(str(c), (x, y), fontsize=7, xytext=(3, 3), textcoords="offset points", color=color)
        if knees:
            ax.scatter([k[0] for k in knees], [k[1] for k in knees], marker="*", s=160, color=color,
                       edgecolors="black", zorder=3)
    if x_sla is not None:
        ax.axvline(x_sla, linestyle="--", color="#333333", label=f"SLA tok/s/user >= {x_sla:g}")
    ax.set_xlabel("tok/s per user (interactivity)")
    ax.set_ylabel("output tok/s per GPU (efficiency)")
    ax.set_title(f"{title}\n(line: mean per concurrency, labelled; dots: single probes; stars: knees)", fontsize=9)
    if ax.get_legend_handles_labels()[0]:  # nothing measured and no SLA line: nothing to name
        ax.legend(fontsize=7)
    ax.set_xlim(left=0, right=max(ax.get_xlim()[1], 1.0))
    ax.set_ylim(bottom=0, top=max(ax.get_ylim()[1], 1.0))
    fig.tight_layout()
    return fig
