"""The ``parcl-bench scaling --plot`` figure: speedup against replica count, parcl beside the
references timed in the same rounds, and where parcl's step goes."""

from __future__ import annotations

import numpy as np

from .common import require_matplotlib, save_figure

PHASES = ("fwd_bwd", "allreduce", "optimizer", "broadcast")


def plot(result: dict, path: str) -> None:
    """Speedup against replica count, parcl's step beside the references measured in the same
    rounds (one colour and one legend entry each), and where parcl's step goes."""
    plt = require_matplotlib()
    rows = result["tables"]["scaling"]["rows"]
    captured = result["params"].get("capture")
    kinds = {"step": ("parcl, captured" if captured else "parcl, eager", "tab:blue"),
             "bare": ("bare replays (no reduce)", "tab:green"),
             "numpy": ("numpy threads", "tab:gray")}
    rows = [r for r in rows if "whole" not in r["label"]]
    counts = sorted({r["replicas"] for r in rows})
    present = [k for k in kinds if any(r.get("kind", "step") == k for r in rows)]
    width = 0.8 / max(1, len(present))
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(9, 3.6))
    for j, kind in enumerate(present):
        label, color = kinds[kind]
        for r in rows:
            if r.get("kind", "step") != kind:
                continue
            x = counts.index(r["replicas"]) + (j - (len(present) - 1) / 2) * width
            err = [[r["speedup"] - r.get("speedup_ci_min", r["speedup"])],
                   [r.get("speedup_ci_max", r["speedup"]) - r["speedup"]]]
            ax1.bar(x, r["speedup"], width, yerr=err, color=color, capsize=3,
                    label=label if r["replicas"] == counts[-1] else None)
            ax1.text(x, r["speedup"] + 0.03, f"{r['speedup']:.2f}", ha="center", va="bottom",
                     fontsize=7)
    # Ideal: c replicas against the first count's, at each group of bars.
    ax1.plot(range(len(counts)), [c / counts[0] for c in counts], ls=":", marker="_",
             markersize=20, color="black", lw=1, label="ideal")
    ax1.set_xticks(range(len(counts)), [str(c) for c in counts])
    ax1.set_xlabel("replicas")
    ax1.set_ylabel("speedup (median, 95% CI)")
    mode = "strong" if result["params"].get("global_batch") is not None else "weak"
    ax1.set_title(f"{result['params']['model']}: {mode} scaling", fontsize=10)
    ax1.legend(fontsize=7, loc="upper left")
    steps = [r for r in rows if r.get("kind", "step") == "step"]
    bottom = np.zeros(len(steps))
    for p, color in zip(PHASES, ("tab:blue", "tab:orange", "tab:green", "tab:red")):
        vals = np.array([r.get(f"{p}_ms", 0.0) for r in steps])
        ax2.bar([str(r["replicas"]) for r in steps], vals, bottom=bottom,
                label=p.replace("_", "+"), color=color)
        bottom += vals
    ax2.set_xlabel("replicas")
    ax2.set_ylabel("ms per step (phases timed apart)")
    ax2.set_title("where parcl's step goes", fontsize=10)
    ax2.legend(fontsize=7)
    fig.tight_layout()
    save_figure(fig, path)
