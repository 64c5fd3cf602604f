"""Plots of ``serving_sweep.py``'s JSON: throughput against concurrency, and latency percentiles against it.

Writes ``<stem>-throughput.png`` (output tokens/s and requests/s per concurrency level) and
``<stem>-latency.png`` (time to first token and time per output token, p50/p90/p99, per level) beside
the JSON, or in ``--out-dir``. Several JSON files (e.g. two dtypes, or a change and its base) share the
axes, one line each, labelled by ``--label`` or their model and dtype.

    python benchmarks/plot.py docs/perf/serving_sweep.json [--table]

``--table`` also prints each file's figures as a markdown table (the one in ``docs/performance.md``).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only: no display needed
import matplotlib.pyplot as plt  # noqa: E402

PERCENTILES = (50, 90, 99)
LINESTYLES = {50: "-", 90: "--", 99: ":"}


def load(path: Path) -> dict:
    report = json.loads(path.read_text())
    if report.get("benchmark") != "serving_sweep":
        raise SystemExit(f"{path}: not a serving_sweep.py result (its 'benchmark' is {report.get('benchmark')!r})")
    return report


def caption(report: dict) -> str:
    machine = report["machine"]
    isa = "+".join(machine["isa"]) or "no AVX2"
    return (
        f"{report['model']} {report['dtype']}, {report['prompt_len']}-token prompts, {report['output_len']} tokens "
        f"each; {machine['cpu']} ({machine['cores']} cores, {isa}); {report['date']}"
    )


def _concurrency_axis(ax, levels: list[int]) -> None:
    """Log-2 x axis with a labelled tick at each level measured."""
    ax.set_xscale("log", base=2)
    ax.set_xticks(levels, [str(level) for level in levels])
    ax.minorticks_off()
    ax.set_xlabel("concurrent requests")


def plot_throughput(reports: list[tuple[str, dict]], path: Path) -> None:
    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    for label, report in reports:
        levels = [run["concurrency"] for run in report["runs"]]
        axes[0].plot(levels, [run["summary"]["output_throughput"] for run in report["runs"]], "o-", label=label)
        axes[1].plot(levels, [run["summary"]["request_throughput"] for run in report["runs"]], "o-", label=label)
    levels = sorted({run["concurrency"] for _, report in reports for run in report["runs"]})
    for ax, ylabel in zip(axes, ("output tokens/s", "requests/s"), strict=True):
        _concurrency_axis(ax, levels)
        ax.set_ylabel(ylabel)
        ax.set_ylim(bottom=0)
        ax.grid(True, alpha=0.3)
        ax.legend()
    axes[0].set_title("Throughput")
    axes[1].set_title("Request throughput")
    fig.suptitle(caption(reports[0][1]), fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_latency(reports: list[tuple[str, dict]], path: Path) -> None:
    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for index, (label, report) in enumerate(reports):
        levels = [run["concurrency"] for run in report["runs"]]
        for ax, metric in zip(axes, ("ttft", "tpot"), strict=True):
            for p in PERCENTILES:
                values = [run["summary"][f"p{p}_{metric}_ms"] for run in report["runs"]]
                name = f"{label} p{p}" if len(reports) > 1 else f"p{p}"
                ax.plot(levels, values, "o", linestyle=LINESTYLES[p], color=colors[index % len(colors)], label=name)
    levels = sorted({run["concurrency"] for _, report in reports for run in report["runs"]})
    for ax, title in zip(axes, ("Time to first token", "Time per output token (after the first)"), strict=True):
        _concurrency_axis(ax, levels)
        ax.set_ylabel("ms")
        ax.set_ylim(bottom=0)
        ax.set_title(title)
        ax.grid(True, alpha=0.3)
        ax.legend()
    fig.suptitle(caption(reports[0][1]), fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def markdown_table(report: dict) -> str:
    """The figures as a markdown table, one row per level, with the share of the machine's CPU that other
    processes took meanwhile (a quiet machine: about 0%)."""
    cores = report["machine"]["cores"] or 1
    lines = [
        "| concurrent requests | requests | output tokens/s | TTFT p50 / p99 (ms) | TPOT p50 / p99 (ms) "
        "| other processes' CPU share |",
        "|---:|---:|---:|---:|---:|---:|",
    ]
    for run in report["runs"]:
        summary = run["summary"]
        foreign = run["foreign_cpu_s"] / (summary["duration_s"] * cores)
        lines.append(
            f"| {run['concurrency']} | {run['requests']} | {summary['output_throughput']:.1f} "
            f"| {summary['p50_ttft_ms']:.0f} / {summary['p99_ttft_ms']:.0f} "
            f"| {summary['p50_tpot_ms']:.1f} / {summary['p99_tpot_ms']:.1f} | {foreign:.0%} |"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("results", nargs="+", type=Path, help="serving_sweep.py JSON files")
    parser.add_argument("--label", action="append", help="one per file (default: model and dtype)")
    parser.add_argument("--out-dir", type=Path, help="default: the first file's folder")
    parser.add_argument("--table", action="store_true", help="also print each file's figures as a markdown table")
    args = parser.parse_args()
    if args.label and len(args.label) != len(args.results):
        raise SystemExit(f"--label given {len(args.label)} times for {len(args.results)} files")
    reports = [load(path) for path in args.results]
    labels = args.label or [f"{report['model']} {report['dtype']}" for report in reports]
    first = args.results[0]
    out_dir = args.out_dir or first.parent
    out_dir.mkdir(parents=True, exist_ok=True)
    pairs = list(zip(labels, reports, strict=True))
    for kind, draw in (("throughput", plot_throughput), ("latency", plot_latency)):
        path = out_dir / f"{first.stem}-{kind}.png"
        draw(pairs, path)
        print(f"wrote {path}")
    if args.table:
        for label, report in pairs:
            print(f"\n{label}:\n\n{markdown_table(report)}")


if __name__ == "__main__":
    main()
