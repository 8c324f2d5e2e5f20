"""The report's plots: one PNG per panel, one subplot per metric, one line per run group.

matplotlib is imported here only, inside the functions, with the Agg canvas (headless, no pyplot state), so
importing this module costs nothing. A metric no run has is left out; a panel with none of its metrics is
not drawn. Every drawn panel is recorded (file, title, metric -> the groups drawn for it) for the manifest.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from slimecli.observe.runs import Group

# The step's stages in the order they run (slimecli.train.stages.STAGES; eval when evaluation is on).
STAGE_ORDER = ("rollout", "old_logp", "ref_logp", "advantages", "update", "sync_weights", "save", "eval")
TIME_TOTALS = ("time/step_s", "time/train_s")  # sums of the stages, not stages


@dataclass(frozen=True)
class Panel:
    file: str
    title: str
    keys: tuple[str, ...]  # metric names; a name ending in "/" takes every metric under it
    bands: tuple[tuple[str, str, str], ...] = ()  # (metric, kind "std" | "range", band metric(s) "a" or "lo|hi")
    markers: bool = False  # sparse metrics (eval): points joined by lines
    band_text: str = ""  # what the band of a single run shows
    x: str = "step"  # the row's key that places a value on the x axis (a row without it: its step)
    skip_leaves: tuple[str, ...] = ()  # under a "prefix/" key: metrics whose last part is one of these


PANELS: tuple[Panel, ...] = (
    Panel("reward.png", "Reward: batch mean", ("reward/mean",), bands=(("reward/mean", "std", "reward/std"),),
          band_text="band: ± std over the batch"),
    Panel("eval.png", "Evaluation on held-out data (x: the training steps behind the weights evaluated)",
          ("eval/",), markers=True, x="eval/weight_version",
          skip_leaves=("weight_version", "samples", "prompts", "failed")),
    Panel("loss.png", "Losses", ("train/loss", "train/pg_loss")),
    Panel("kl.png", "KL", ("train/kl", "train/ppo_kl")),
    Panel("entropy.png", "Entropy of the policy", ("train/entropy",)),
    Panel("clipfrac.png", "Clip fraction", ("train/pg_clipfrac", "train/pg_dual_clipfrac", "off_policy/clipped_frac",
                                              "off_policy/masked_frac")),
    Panel("grad_norm.png", "Gradient norm (before clipping)", ("train/grad_norm",)),
    Panel("response_len.png", "Response length (tokens): mean", ("rollout/response_len_mean",),
          bands=(("rollout/response_len_mean", "range", "rollout/response_len_min|rollout/response_len_max"),),
          band_text="band: min..max of the batch"),
    Panel("swe.png", "SWE tasks", ("swe/resolved_rate", "swe/f2p_frac", "swe/p2p_frac", "swe/patch_applied_rate")),
)
TIME_PANEL = "time.png"


def panel_keys(panel: Panel, available: set[str]) -> list[str]:
    out: list[str] = []
    for key in panel.keys:
        if key.endswith("/"):
            out += sorted((k for k in available if k.startswith(key) and k.rsplit("/", 1)[-1] not in panel.skip_leaves),
                          key=_metric_order)
        elif key in available:
            out.append(key)
    return out


def _metric_order(key: str) -> tuple[str, int, float, str]:
    """eval/<name>/...: by dataset, then reward_mean, pass@k by k, the rest by name."""
    head, _, leaf = key.rpartition("/")
    if leaf.endswith("reward_mean"):
        return head, 0, 0.0, leaf
    if leaf.startswith("pass@") and leaf[5:].isdigit():
        return head, 1, float(leaf[5:]), leaf
    return head, 2, 0.0, leaf


def stage_keys(available: set[str]) -> list[str]:
    """time/<stage>_s of every stage present, in the order the stages run, unknown stages last."""
    stages = [k for k in available if k.startswith("time/") and k.endswith("_s") and k not in TIME_TOTALS]
    order = {f"time/{s}_s": i for i, s in enumerate(STAGE_ORDER)}
    return sorted(stages, key=lambda k: (order.get(k, len(order)), k))


def _figure(n: int, title: str, fitted: bool = False) -> tuple[Any, list[Any]]:
    """``fitted``: margins measured from the texts (long tick labels); else fixed ones, in inches, which fit the
    metric panels' numeric ticks and cost a fraction of the measuring (most of a report's time)."""
    from matplotlib.figure import Figure

    cols = min(n, 3)
    rows = (n + cols - 1) // cols
    width, height = 5.2 * cols, 3.6 * rows + 0.5
    fig = Figure(figsize=(width, height), layout="constrained" if fitted else None)
    fig.suptitle(title)
    if not fitted:
        fig.subplots_adjust(left=0.75 / width, right=1 - 0.2 / width, bottom=0.55 / height,
                            top=1 - 0.75 / height, wspace=0.25, hspace=0.45)
    axes = [fig.add_subplot(rows, cols, i + 1) for i in range(n)]
    return fig, axes


def _save(fig: Any, path: Path) -> None:
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.ticker import MaxNLocator

    for ax in fig.axes:
        if ax.get_xlabel() == "step":
            ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    FigureCanvasAgg(fig)
    fig.savefig(path, dpi=100)


def _colour(i: int) -> str:
    return f"C{i % 10}"


def _band(group: Group, key: str, bands: dict[str, tuple[str, str]], x: str) -> tuple[list[float], list[float],
                                                                                      list[float], list[float]] | None:
    """(steps, mean, lower, upper) of the band to draw around ``key``, or None."""
    kind_spec = bands.get(key)
    if len(group.runs) > 1:  # seeds: the spread across them
        steps, mean, std = group.series(key, x)
        return steps, mean, [m - s for m, s in zip(mean, std, strict=True)], [m + s for m, s in
                                                                              zip(mean, std, strict=True)]
    if kind_spec is None:
        return None
    kind, spec = kind_spec
    run = group.runs[0]
    steps, mean = run.series(key)
    if kind == "std":
        spread = dict(zip(*run.series(spec), strict=True))
        if not spread:
            return None
        return steps, mean, [m - spread.get(s, 0.0) for s, m in zip(steps, mean, strict=True)], \
            [m + spread.get(s, 0.0) for s, m in zip(steps, mean, strict=True)]
    lo_key, hi_key = spec.split("|")
    lo, hi = dict(zip(*run.series(lo_key), strict=True)), dict(zip(*run.series(hi_key), strict=True))
    if not lo or not hi:
        return None
    return steps, mean, [lo.get(s, m) for s, m in zip(steps, mean, strict=True)], \
        [hi.get(s, m) for s, m in zip(steps, mean, strict=True)]


def draw_panel(panel: Panel, groups: list[Group], out_dir: Path) -> dict[str, Any] | None:
    available = set().union(*(r.keys() for g in groups for r in g.runs))
    keys = panel_keys(panel, available)
    if not keys:
        return None
    bands = {metric: (kind, spec) for metric, kind, spec in panel.bands}
    grouped = any(len(g.runs) > 1 for g in groups)
    band_text = "band: ± std across a line's runs" if grouped else panel.band_text
    title = f"{panel.title} ({band_text})" if band_text else panel.title
    fig, axes = _figure(len(keys), title)
    drawn: dict[str, list[str]] = {}
    for ax, key in zip(axes, keys, strict=True):
        has_band = False
        for i, group in enumerate(groups):
            band = _band(group, key, bands, panel.x)
            if band is not None:
                steps, mean, lower, upper = band
            else:
                steps, mean, _ = group.series(key, panel.x)
            if not steps:
                continue
            ax.plot(steps, mean, marker="o" if panel.markers else None, markersize=3, linewidth=1.4,
                    color=_colour(i), label=group.display)
            if band is not None:
                ax.fill_between(steps, lower, upper, color=_colour(i), alpha=0.18, linewidth=0)
                has_band = True
            drawn.setdefault(key, []).append(group.display)
        ax.set_title(key, fontsize=10)
        ax.set_xlabel("step")
        ax.grid(alpha=0.3)
        if len(groups) > 1 or has_band:
            ax.legend(fontsize=7)
    path = out_dir / panel.file
    _save(fig, path)
    return {"file": panel.file, "title": title, "series": drawn}


def draw_time(groups: list[Group], out_dir: Path) -> dict[str, Any] | None:
    """Left: the split over steps (one run: stacked areas) or the step time of each group; right: the mean
    seconds per step of each stage, one stacked bar per group."""
    available = set().union(*(r.keys() for g in groups for r in g.runs))
    stages = stage_keys(available)
    if not stages:
        return None
    fig, (left, right) = _figure(2, "Where a step's time goes (seconds)", fitted=True)
    drawn: dict[str, list[str]] = {}
    names = [k[len("time/"):-len("_s")] for k in stages]
    if len(groups) == 1 and len(groups[0].runs) == 1:
        run = groups[0].runs[0]
        steps = [s for s, _ in zip(*run.series(stages[0]), strict=True)]
        columns = []
        for key in stages:
            at = dict(zip(*run.series(key), strict=True))
            columns.append([at.get(s, 0.0) for s in steps])
            drawn.setdefault(key, []).append(groups[0].display)
        left.stackplot(steps, *columns, labels=names, colors=[_colour(i) for i in range(len(stages))], alpha=0.85)
        left.set_title("per stage, every step", fontsize=10)
        left.legend(fontsize=7, loc="upper left")
    else:
        for i, group in enumerate(groups):
            steps, mean, _ = group.series("time/step_s")
            if steps:
                left.plot(steps, mean, color=_colour(i), linewidth=1.4, label=group.display)
                drawn.setdefault("time/step_s", []).append(group.display)
        left.set_title("time/step_s", fontsize=10)
        left.legend(fontsize=7)
    left.set_xlabel("step")
    left.grid(alpha=0.3)
    labels = [g.display for g in groups]
    bottoms = [0.0] * len(groups)
    for j, key in enumerate(stages):
        widths = []
        for group in groups:
            values = [v for r in group.runs for v in r.series(key)[1]]
            widths.append(sum(values) / len(values) if values else 0.0)
            if values and len(groups) > 1:
                drawn.setdefault(key, []).append(group.display)
        right.barh(range(len(groups)), widths, left=bottoms, color=_colour(j), label=names[j])
        bottoms = [b + w for b, w in zip(bottoms, widths, strict=True)]
    right.set_yticks(range(len(groups)), [_short(lab) for lab in labels], fontsize=7)
    right.set_xlabel("mean seconds per step")
    right.set_title("mean split per step", fontsize=10)
    right.legend(fontsize=7)
    right.grid(alpha=0.3, axis="x")
    _save(fig, out_dir / TIME_PANEL)
    return {"file": TIME_PANEL, "title": "Where a step's time goes", "series": drawn}


def _short(label: str, width: int = 40) -> str:
    return label if len(label) <= width else label[: width - 1] + "…"


def draw_all(groups: list[Group], out_dir: Path) -> list[dict[str, Any]]:
    """Every panel that has data, written to ``out_dir``; their manifest entries in order."""
    out_dir.mkdir(parents=True, exist_ok=True)
    drawn = [draw_panel(p, groups, out_dir) for p in PANELS]
    drawn.append(draw_time(groups, out_dir))
    return [d for d in drawn if d is not None]
