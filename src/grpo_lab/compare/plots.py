"""Pictures next to the leaderboard: each run's objective with its 95% interval (forest plot), training curves of
every run on shared axes, and Optuna's plots."""

from __future__ import annotations

import logging
import warnings
from pathlib import Path
from typing import Any

from grpo_lab.compare.leaderboard import Board
from grpo_lab.evaluation.ranking import Verdict
from grpo_lab.run.summary import HEADLINES

log = logging.getLogger("grpo_lab")

CURVES = tuple((h.key, h.title) for h in HEADLINES)  # (history key, title): one 2x2 panel each
_COLORS = {Verdict.LEADER: "tab:blue", Verdict.TIED: "tab:orange"}  # the forest plot's; the rest gray


def _matplotlib() -> Any:
    import matplotlib

    matplotlib.use("Agg")  # files only, no display
    import matplotlib.pyplot as plt

    return plt


def training_curves(board: Board, out_dir: Path) -> list[Path]:
    """curves.png (2x2 panels, one line per run, by trainer step) and curves.html (interactive)."""
    plt = _matplotlib()
    runs = [(row["run"], row["_run"]) for row in board.rows if row["_run"].history]
    if not runs:
        return []
    fig, axes = plt.subplots(2, 2, figsize=(12, 8), sharex=True)
    for ax, (key, title) in zip(axes.flat, CURVES, strict=True):
        for label, run in runs:
            points = [(r["step"], r[key]) for r in run.history if isinstance(r.get(key), int | float)]
            if points:
                ax.plot(*zip(*points, strict=True), marker=".", linewidth=1.2, label=label)
        ax.set_title(title)
        ax.grid(alpha=0.3)
    for ax in axes[1]:
        ax.set_xlabel("trainer step")
    handles, labels = axes.flat[0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="lower center", ncol=min(len(labels), 6), fontsize="small")
    fig.suptitle(f"Training curves: {board.source.label}")
    fig.tight_layout(rect=(0, 0.06, 1, 0.96))
    png = out_dir / "curves.png"
    fig.savefig(png, dpi=100)
    plt.close(fig)
    written = [png]
    html = _curves_html(runs, out_dir / "curves.html", board.source.label)
    if html is not None:
        written.append(html)
    return written


def forest(board: Board, out_dir: Path) -> list[Path]:
    """forest.png: one row per run, best first, its objective with the 95% interval; the leader and the runs
    tied with it (the ranking's verdict) stand out from the rest."""
    rows = [r for r in board.rows if board.paired and r.get("ci_low") is not None and r["_run"].objective is not None]
    if not rows:
        return []
    plt = _matplotlib()
    fig, ax = plt.subplots(figsize=(8, 1.2 + 0.35 * len(rows)))
    for y, row in enumerate(rows):
        color = _COLORS.get(row["_entry"].verdict, "tab:gray")
        value, low, high = row["_run"].objective, row["ci_low"], row["ci_high"]
        ax.errorbar(value, y, xerr=[[value - low], [high - value]], fmt="o", color=color, capsize=3)
        label = row.get("vs_#1") or ""
        ax.annotate(label, (high, y), xytext=(6, 0), textcoords="offset points", va="center", fontsize="small")
    ax.set_yticks(range(len(rows)), [str(r["run"]) for r in rows], fontsize="small")
    ax.invert_yaxis()  # the leader on top
    ax.set_xlabel(f"{board.source.metrics[0]} (95% interval)")
    ax.grid(axis="x", alpha=0.3)
    ax.set_title(
        f"{board.source.label}: leader (blue), tied with it (orange), distinguishable (gray)", fontsize="small"
    )
    fig.tight_layout()
    png = out_dir / "forest.png"
    fig.savefig(png, dpi=100)
    plt.close(fig)
    return [png]


def _curves_html(runs: list[tuple[str, Any]], path: Path, title: str) -> Path | None:
    try:
        from plotly.subplots import make_subplots
    except ImportError:
        return None
    fig = make_subplots(rows=2, cols=2, subplot_titles=[t for _, t in CURVES], shared_xaxes=True)
    for i, (key, _) in enumerate(CURVES):
        for n, (label, run) in enumerate(runs):
            points = [(r["step"], r[key]) for r in run.history if isinstance(r.get(key), int | float)]
            if points:
                xs, ys = zip(*points, strict=True)
                fig.add_scatter(
                    x=xs,
                    y=ys,
                    name=label,
                    legendgroup=label,
                    showlegend=i == 0,
                    line={"color": f"hsl({(n * 67) % 360},70%,45%)"},
                    row=i // 2 + 1,
                    col=i % 2 + 1,
                )
    fig.update_layout(title=f"Training curves: {title}", height=800)
    fig.write_html(path, include_plotlyjs="cdn")
    return path


def study_plots(study: Any, out_dir: Path) -> list[Path]:
    """Optimisation history, parameter importances and parallel coordinates (PNG, and HTML with plotly)."""
    plt = _matplotlib()
    import optuna.visualization as vis
    import optuna.visualization.matplotlib as mvis

    written: list[Path] = []
    multi = len(study.directions) > 1
    target = (lambda t: t.values[0]) if multi else None
    name = study.metric_names[0] if study.metric_names else "objective"
    plots = {
        "optimization_history": (mvis.plot_optimization_history, vis.plot_optimization_history),
        "param_importances": (mvis.plot_param_importances, vis.plot_param_importances),
        "parallel_coordinates": (mvis.plot_parallel_coordinate, vis.plot_parallel_coordinate),
    }
    for stem, (png_plot, html_plot) in plots.items():
        kwargs = {"target": target, "target_name": name} if multi else {}
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # Optuna's "experimental" notes on the matplotlib backend
                ax = png_plot(study, **kwargs)
                figure = (ax[0] if hasattr(ax, "__len__") else ax).figure
                figure.set_size_inches(10, 6)
                figure.tight_layout()
                figure.savefig(out_dir / f"{stem}.png", dpi=100)
                plt.close(figure)
                written.append(out_dir / f"{stem}.png")
                html_plot(study, **kwargs).write_html(out_dir / f"{stem}.html", include_plotlyjs="cdn")
                written.append(out_dir / f"{stem}.html")
        except (ValueError, RuntimeError, ImportError, ZeroDivisionError) as e:
            # e.g. importances need two finished trials with varied parameters
            log.info("No %s plot: %s", stem.replace("_", " "), e)
    return written
