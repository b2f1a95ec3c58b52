"""The benchmark's plots, from its report.json (bench-e2e runs this):

- cdf-<scenario>.png: the latency CDF of lone calls, one line per system;
- throughput-p99-<scenario>.png: p99 latency against calls per second
  achieved at each open-loop step, one line per system.

    python plots.py report.json OUT_DIR
"""
import json
import os
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def slug(name):
    return name.replace("/", "-")


def finish(fig, ax, title, path):
    """Title, grid and legend; writes the figure to path."""
    ax.set_title(title)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main():
    report_path, out = sys.argv[1], sys.argv[2]
    with open(report_path) as f:
        report = json.load(f)
    for scenario in report["scenarios"]:
        name = scenario["scenario"]["name"]

        fig, ax = plt.subplots(figsize=(7, 4.5))
        for system in scenario["systems"]:
            cdf = system["lone"]["cdf"]
            ax.plot([max(us, 1) / 1000 for _, us in cdf], [p for p, _ in cdf],
                    marker=".", label=system["system"])
        floor = scenario["floors"]["onnx"]["p50_us"] + scenario["floors"]["gather"]["p50_us"]
        ax.axvline(floor / 1000, color="grey", linestyle=":", label="ONNX + gather floor (p50)")
        ax.set_xscale("log")
        ax.set_xlabel("latency of a lone call (ms, log scale)")
        ax.set_ylabel("percentile")
        finish(fig, ax, f"{name}: lone-call latency CDF",
               os.path.join(out, f"cdf-{slug(name)}.png"))

        fig, ax = plt.subplots(figsize=(7, 4.5))
        for system in scenario["systems"]:
            steps = system["sweep"] + ([system["at_70"]] if system.get("at_70") else [])
            steps = sorted((s for s in steps if s["summary"]["calls"] > 0),
                           key=lambda s: s["summary"]["throughput"])
            ax.plot([s["summary"]["throughput"] for s in steps],
                    [s["summary"]["p99_us"] / 1000 for s in steps],
                    marker="o", label=system["system"])
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("calls per second achieved (open loop, log scale)")
        ax.set_ylabel("p99 latency (ms, log scale)")
        finish(fig, ax, f"{name}: throughput against p99",
               os.path.join(out, f"throughput-p99-{slug(name)}.png"))


if __name__ == "__main__":
    main()
