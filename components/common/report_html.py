"""Self-contained HTML evaluation reports (Vertex shows them sandboxed): inline SVG plots,
`data:` thumbnails, inline style, no scripts; each plot a `<figure class="plot" id=...>`
(its `plot_id`) with its `caption` under it.
"""

from __future__ import annotations

import base64
import html
import io
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np

REPORT_HTML_FILE = "report.html"
_STYLE = """
body{font-family:system-ui,-apple-system,Segoe UI,Roboto,sans-serif;margin:24px;color:#1f2328}
h1{font-size:22px}h2{font-size:17px;margin-top:28px;border-bottom:1px solid #d0d7de}
table.summary td,table.baselines td,table.baselines th{padding:2px 14px 2px 0}
figure.plot{margin:12px 0}
figure.plot svg{max-width:100%;height:auto}figcaption{color:#57606a;font-size:13px}
.grid{display:flex;flex-wrap:wrap;gap:10px}.cell{width:150px;font-size:12px}
.cell img{width:140px;height:140px;object-fit:contain;image-rendering:pixelated;
border:1px solid #d0d7de}.snippet{border-left:3px solid #cf222e;padding:4px 10px;
margin:8px 0;font-size:13px}.muted{color:#57606a}
"""


def figure(width: float = 7.0, height: float = 4.0):
    """A matplotlib Figure not attached to pyplot (no GUI backend, no global state)."""
    from matplotlib.figure import Figure

    return Figure(figsize=(width, height), layout="constrained")


def thumbnail_data_uri(pixels: np.ndarray, max_side: int = 128) -> str:
    """An RGB uint8 image as a `data:image/jpeg;base64,...` thumbnail, `max_side` at most."""
    from PIL import Image

    image = Image.fromarray(np.asarray(pixels, dtype=np.uint8))
    image.thumbnail((max_side, max_side))
    buffer = io.BytesIO()
    image.convert("RGB").save(buffer, format="JPEG", quality=85)
    return "data:image/jpeg;base64," + base64.b64encode(buffer.getvalue()).decode()


def plot(plot_id: str, fig, caption: str) -> str:
    """One figure of the report: its inline `<svg>` (text as text) and caption."""
    import matplotlib

    buffer = io.StringIO()
    with matplotlib.rc_context({"svg.fonttype": "none", "svg.hashsalt": "report"}):
        fig.savefig(buffer, format="svg")
    svg = buffer.getvalue()
    return (f'<figure class="plot" id="{plot_id}">{svg[svg.index("<svg"):]}'
            f"<figcaption>{html.escape(caption)}</figcaption></figure>")


def page(title: str, summary: Mapping[str, Any], sections: Iterable[tuple[str, str]]) -> str:
    """The whole document: `title` as its title and heading, the `summary` figures in a
    table under it, then the `(heading, html)` sections in order."""
    rows = "".join(f"<tr><td>{html.escape(str(k))}</td><td><b>{html.escape(_fmt(v))}</b></td>"
                   "</tr>" for k, v in summary.items())
    body = "".join(f"<section><h2>{html.escape(h)}</h2>{content}</section>"
                   for h, content in sections)
    return (f"<!DOCTYPE html><html lang=\"en\"><head><meta charset=\"utf-8\">"
            f"<title>{html.escape(title)}</title><style>{_STYLE}</style></head><body>"
            f"<h1>{html.escape(title)}</h1><table class=\"summary\">{rows}</table>{body}"
            "</body></html>")


def baseline_table(result: Mapping[str, Any], names: Sequence[str]) -> str:
    """The model beside each baseline on the same split (`result["baseline"]`), or ""."""
    if not result.get("baseline"):
        return ""
    header = "".join(f"<th>{html.escape(n)}</th>" for n in ("model", *names))
    rows = [("this model", result)] + list(result["baseline"].items())
    body = "".join(
        f'<tr class="{"model" if i == 0 else "baseline"}"><td>{html.escape(name)}</td>'
        + "".join(f"<td>{html.escape(_fmt(numbers[n])) if n in numbers else ''}</td>"
                  for n in names) + "</tr>"
        for i, (name, numbers) in enumerate(rows))
    return f'<table class="baselines" id="baselines"><tr>{header}</tr>{body}</table>'


def _fmt(value: Any) -> str:
    return f"{value:.4f}" if isinstance(value, float) else str(value)


def _pair_grid(colours: np.ndarray, counts: np.ndarray, labels: Sequence[str], cmap: str,
               dark_above: float, colorbar: str, *, zeros: bool = True,
               scale: tuple[float | None, float | None] = (None, None), **axes: str):
    """A k x k figure of label pairs coloured by `colours`, each cell holding its count."""
    k = len(labels)
    fig = figure(min(2.0 + 0.6 * k, 12), min(1.6 + 0.55 * k, 11))
    ax = fig.add_subplot()
    image = ax.imshow(colours, cmap=cmap, vmin=scale[0], vmax=scale[1])
    ax.set_xticks(range(k), labels, rotation=45, ha="right")
    ax.set_yticks(range(k), labels)
    ax.set(**axes)
    for i, j in np.ndindex(k, k):  # row by row
        if zeros or counts[i, j]:
            ax.text(j, i, str(counts[i, j]), ha="center", va="center", fontsize=8,
                    color="white" if colours[i, j] > dark_above else "black")
    fig.colorbar(image, ax=ax, label=colorbar)
    return fig


def metric_bars(plot_id: str, per_label: Mapping[str, Mapping[str, float]],
                caption: str, second: Mapping[str, Mapping[str, float]] | None = None,
                names: tuple[str, str] = ("", "")) -> str:
    """Precision, recall and F1 per class (and `second`'s beside them, e.g. tuned)."""
    labels = list(per_label)
    sets = [(names[0], per_label)] + ([(names[1], second)] if second else [])
    fig = figure(min(3 + 0.7 * len(labels) * len(sets), 14), 3.6)
    ax = fig.add_subplot()
    x = np.arange(len(labels))
    width = 0.8 / (3 * len(sets))
    colors = {"precision": "#0969da", "recall": "#1a7f37", "f1": "#8250df"}
    for s, (prefix, values) in enumerate(sets):
        for m, metric in enumerate(("precision", "recall", "f1")):
            offset = (s * 3 + m - (3 * len(sets) - 1) / 2) * width
            ax.bar(x + offset, [values[label][metric] for label in labels], width,
                   label=f"{metric} {prefix}".strip(), color=colors[metric],
                   alpha=1.0 if s == 0 else 0.45)
    ax.set_xticks(x, labels, rotation=30, ha="right")
    ax.set_ylim(0, 1.05)
    ax.legend(ncol=3 * len(sets), fontsize=8, loc="lower right")
    return plot(plot_id, fig, caption)


def curves(plot_id: str, truth: np.ndarray, scores: np.ndarray, labels: Sequence[str],
           caption: str, marks: Mapping[str, Sequence[float]] | None = None) -> str:
    """One-vs-rest ROC (left) and precision-recall (right) curves per label.

    Args:
        truth: 0/1 matrix (n, k).
        scores: Probabilities (n, k).
        labels: The k names.
        marks: Name -> one threshold per label, marked on each precision-recall curve.
    """
    from sklearn.metrics import auc, precision_recall_curve, roc_curve

    fig = figure(11, 4.4)
    roc_ax, pr_ax = fig.subplots(1, 2)
    markers = ["o", "s", "^", "D"]
    for i, label in enumerate(labels):
        if truth[:, i].min() == truth[:, i].max():
            continue  # one outcome only: no curve
        fpr, tpr, _ = roc_curve(truth[:, i], scores[:, i])
        line, = roc_ax.plot(fpr, tpr, lw=1.2, label=f"{label} (AUC {auc(fpr, tpr):.2f})")
        precision, recall, thresholds = precision_recall_curve(truth[:, i], scores[:, i])
        pr_ax.plot(recall, precision, lw=1.2, color=line.get_color(), label=label)
        for m, (name, values) in enumerate((marks or {}).items()):
            at = min(int(np.searchsorted(thresholds, values[i])), len(thresholds) - 1)
            pr_ax.plot(recall[at], precision[at], markers[m % len(markers)],
                       color=line.get_color(), markersize=6,
                       label=name if i == 0 else None, markeredgecolor="black")
    roc_ax.plot([0, 1], [0, 1], ":", color="grey")
    roc_ax.set(xlabel="false positive rate", ylabel="true positive rate", title="ROC")
    pr_ax.set(xlabel="recall", ylabel="precision", title="precision-recall", ylim=(0, 1.02))
    for ax in (roc_ax, pr_ax):
        ax.legend(fontsize=7, loc="lower right" if ax is roc_ax else "lower left")
    return plot(plot_id, fig, caption)


def single_label_sections(result: Mapping[str, Any], truth: np.ndarray, scores: np.ndarray,
                          classes: Sequence[str],
                          bars_id: str = "per-class") -> list[tuple[str, str]]:
    """A single-label evaluation's sections: confusion matrix (normalised per true class,
    counts in the cells), per-class bars, curves.

    Args:
        result: The evaluation's metrics (`single_label_metrics`).
        truth: One-hot true classes (n, k).
        scores: Probabilities (n, k).
        classes: The k class names.
        bars_id: Element id of the per-class bars.
    """
    counts = np.asarray(result["confusion_matrix"]["matrix"], dtype=int)
    rates = counts / np.maximum(counts.sum(axis=1, keepdims=True), 1)
    confusion = _pair_grid(rates, counts, classes, "Blues", 0.5, "share of the true class",
                           zeros=False, scale=(0, 1), xlabel="predicted", ylabel="true")
    return [
        ("Confusion matrix", plot("confusion", confusion, "Rows: true class, normalised to 1; "
                                                         "cells: example counts.")),
        ("Per class", metric_bars(bars_id, result["per_class"],
                                  "Precision, recall and F1 of each class.")),
        ("ROC and precision-recall", curves("curves", truth, scores, classes,
                                            "One class against the rest.")),
    ]


def training_curves(plot_id: str, phases: Mapping[str, Sequence[Mapping[str, float]]],
                    pairs: Sequence[tuple[str, str]], caption: str) -> str:
    """Per-epoch training and validation series, epochs counted across the phases.

    Args:
        phases: Phase name -> its epoch rows (dicts of series values), in order.
        pairs: (training series, validation series) per panel, e.g. ("loss", "val_loss").
    """
    fig = figure(5.5 * len(pairs), 3.6)
    axes = np.atleast_1d(fig.subplots(1, len(pairs)))
    start = 1
    for phase, rows in phases.items():
        if not rows:
            continue
        epochs = np.arange(start, start + len(rows))
        for ax, pair in zip(axes, pairs):
            for name, style in zip(pair, ("-o", "--s")):
                values = [row.get(name) for row in rows]
                if any(v is not None for v in values):
                    ax.plot(epochs, [np.nan if v is None else v for v in values], style,
                            markersize=3, label=f"{name} ({phase})")
            ax.axvline(start - 0.5, color="grey", lw=0.8, ls=":")
            ax.annotate(phase, (start - 0.4, 1.0), xycoords=("data", "axes fraction"),
                        va="top", fontsize=8, color="grey")
        start += len(rows)
    from matplotlib.ticker import MaxNLocator

    for ax, pair in zip(axes, pairs):
        ax.set(xlabel="epoch", title=" / ".join(pair))
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.legend(fontsize=7)
    return plot(plot_id, fig, caption)


def cooccurrence(truth: np.ndarray, labels: Sequence[str]) -> str:
    """How often each pair of labels is set on the same example."""
    counts = truth.T.astype(int) @ truth.astype(int)
    fig = _pair_grid(counts, counts, labels, "Purples", counts.max() / 2, "examples")
    return plot("cooccurrence", fig, "Examples with both labels (diagonal: examples with the "
                                     "label).")
