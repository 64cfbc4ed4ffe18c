"""KFP face of `evaluate_text_model`, outputs as the image evaluator's (a confusion matrix
for single-label models only)."""

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


def evaluate_text_classifier(
    model: Input[Model],
    dataset: Input[Dataset],
    metrics: Output[Metrics],
    classification_metrics: Output[ClassificationMetrics],
    report: Output[Markdown],
    report_html: Output[HTML],
    evaluation: Output[Artifact],
    split: str = "test",
    threshold: float = -1.0,
    batch_size: int = 64,
):
    """Evaluates a trained text classifier on one split of a prepared dataset.

    Args:
        model: Folder from the text training step: `export.pkl` (fastai learner) and `labels.json` (labels, task, threshold, tuned thresholds).
        dataset: Folder from the text preparation step; its labels must equal the model's.
        metrics: Headline scalars: num_examples; multi-label: micro/macro F1, precision, recall, subset accuracy, Hamming loss, f1_<label>, and tuned_micro_f1/tuned_macro_f1 at the tuned thresholds; single-label: accuracy, macro/weighted F1, f1_<class>; beside them baseline_<metric> (TF-IDF + logistic regression fitted on the train split) and every_label_<metric> or majority_class_<metric> (the constant answer), scored on the same split.
        classification_metrics: Confusion matrix (rows true, columns predicted) of a single-label model; empty for multi-label.
        report: The evaluation report in Markdown (multi-label: fixed and tuned thresholds side by side).
        report_html: The report as a self-contained HTML page (plots inline, no scripts), which the Vertex console renders: confusions, per-class figures, ROC/precision-recall curves, training curves, the worst mistakes.
        evaluation: Folder with `metrics.json` (every number, per label included), `report.md` and `report.html`.
        split: Split to evaluate: "train", "validation" or "test".
        threshold: Multi-label decision threshold; negative uses the one the model was trained with.
        batch_size: Texts per forward pass.
    """
    import shutil

    from components.common.metrics import REPORT_FILE, scalar_summary
    from components.common.report_html import REPORT_HTML_FILE
    from components.evaluate_text.evaluation import evaluate_text_model

    result = evaluate_text_model(model.path, dataset.path, evaluation.path, split=split,
                                 threshold=None if threshold < 0 else threshold,
                                 batch_size=batch_size)
    shutil.copyfile(f"{evaluation.path}/{REPORT_FILE}", report.path)
    shutil.copyfile(f"{evaluation.path}/{REPORT_HTML_FILE}", report_html.path)
    for name, value in scalar_summary(result).items():
        metrics.log_metric(name, value)
    if result["task"] != "multi_label":
        classification_metrics.log_confusion_matrix(result["confusion_matrix"]["labels"],
                                                    result["confusion_matrix"]["matrix"])
    evaluation.metadata.update({
        "split": split,
        "task": result["task"],
        "num_examples": result["num_examples"],
        "macro_f1": result["macro_f1"],
    })
