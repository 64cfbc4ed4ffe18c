"""KFP face of `evaluate_image_model`; the full results a later step reads are in the
`evaluation` folder (Metrics hold metadata only, a Markdown artifact one file)."""

from kfp.dsl import (
    HTML,
    Artifact,
    ClassificationMetrics,
    Dataset,
    Input,
    Markdown,
    Metrics,
    Model,
    Output,
)


def evaluate_image_classifier(
    model: Input[Model],
    dataset: Input[Dataset],
    metrics: Output[Metrics],
    classification_metrics: Output[ClassificationMetrics],
    report: Output[Markdown],
    report_html: Output[HTML],
    evaluation: Output[Artifact],
    split: str = "test",
    batch_size: int = 64,
):
    """Evaluates a trained image classifier on one split of a sharded dataset.

    Args:
        model: Folder with `model.keras` (tf-keras; float32 pixels 0..255 in, softmax out) and `labels.json` ({"classes": [...]}).
        dataset: Folder written by the sharding step: TFRecord shards and `manifest.json`; its classes must equal the model's.
        metrics: Headline scalars: num_examples, accuracy, macro/weighted F1, macro precision/recall, roc_auc (two classes), f1_<class> (up to 20 classes).
        classification_metrics: Confusion matrix (rows true, columns predicted) and, for two classes, the ROC curve of the second class.
        report: The evaluation report in Markdown.
        report_html: The report as a self-contained HTML page (plots inline, no scripts), which the Vertex console renders: confusions, per-class figures, ROC/precision-recall curves, training curves, the worst mistakes.
        evaluation: Folder with `metrics.json` (every number, per class included), `report.md` and `report.html`.
        split: Split to evaluate: "train", "validation" or "test".
        batch_size: Images per forward pass.
    """
    import shutil

    from components.common.metrics import REPORT_FILE, scalar_summary
    from components.common.report_html import REPORT_HTML_FILE
    from components.evaluate_image.evaluation import evaluate_image_model

    result = evaluate_image_model(model.path, dataset.path, evaluation.path, split=split,
                                  batch_size=batch_size)
    shutil.copyfile(f"{evaluation.path}/{REPORT_FILE}", report.path)
    shutil.copyfile(f"{evaluation.path}/{REPORT_HTML_FILE}", report_html.path)
    for name, value in scalar_summary(result).items():
        metrics.log_metric(name, value)
    classification_metrics.log_confusion_matrix(result["confusion_matrix"]["labels"],
                                                result["confusion_matrix"]["matrix"])
    if result.get("roc"):
        roc = result["roc"]
        # metrics.roc_curve already replaces scikit-learn's infinite first threshold
        # (which KFP rejects) with a finite one; clamping to [0, 1] keeps the axis a probability.
        thresholds = [min(max(t, 0.0), 1.0) for t in roc["thresholds"]]
        classification_metrics.log_roc_curve(roc["fpr"], roc["tpr"], thresholds)
    evaluation.metadata.update({
        "split": split,
        "num_examples": result["num_examples"],
        "accuracy": result["accuracy"],
        "macro_f1": result["macro_f1"],
    })
