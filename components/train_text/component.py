"""KFP face of the text training step: `train_text_classifier` takes every field of
`contract.TrainConfig` (its type, default and help, written from the class by
`components.common.written.step_function`) between its artifacts and its run inputs."""

from kfp.dsl import Dataset, Input, Metrics, Model, Output

from components.common.written import settings_from_step, step_function
from components.train_text.contract import TrainConfig, parse_model_config


def train_step(values: dict) -> None:
    """The step's work: trains with the inputs' settings, logs the metrics, tags the model.

    Args:
        values: Every input of `train_text_classifier`, by name.
    """
    import logging

    from components.text_common.scores import validation_scalars
    from components.train_text.training import model_metadata
    from components.train_text.training import train_text_classifier as train

    logging.basicConfig(level=logging.INFO)  # one line per epoch in the job's log
    config = settings_from_step(TrainConfig, values, {"model_config": parse_model_config})
    dataset, model, metrics = values["dataset"], values["model"], values["metrics"]
    result = train(dataset.path, model.path, config, lm_assets_uri=values["lm_assets_uri"],
                   tensorboard_folder=values["tensorboard_dir"],
                   hypertune_metric=values["hypertune_metric"] or None)
    for name, value in validation_scalars(result).items():
        metrics.log_metric(name, float(value))
    model.metadata.update(model_metadata(result, config, model.path, dataset.path,
                                         values["lm_assets_uri"],
                                         values["lm_assets_fingerprint"]))


def written_step(settings: type = TrainConfig):
    """`train_text_classifier` written from `settings`."""
    return step_function(
        "train_text_classifier", settings,
        "Fine-tunes a language model on the texts, then trains a ULMFiT classifier (fastai "
        "AWD-LSTM).",
        before=[
            ("dataset", Input[Dataset], "Folder from the text preparation step: "
             "train/validation/test CSVs and manifest.json (labels, task)."),
            ("model", Output[Model], "Output folder: `export.pkl` (fastai learner for "
             "`load_learner`), `labels.json` (labels, task, threshold, per-label tuned "
             "thresholds), `metrics.json` and `per_label_metrics.json` (validation figures per "
             "label at the fixed and tuned thresholds)."),
            ("metrics", Output[Metrics], "Validation scalars: micro/macro F1 at the threshold "
             "and at tuned thresholds (multi-label), or accuracy and macro F1 (single-label); "
             "epochs and seconds per classifier epoch."),
        ],
        after=[
            ("lm_assets_uri", "", "Root (gs:// or local) of pretrained LMs laid out as "
             "`<lang>/{forward,backward}/{config.json,vocab.pkl,weights.pth}` and "
             "`<lang>/spm/spm.model` for ja, ko, zh; needed when pretrained is true, except "
             "with lang=en (fastai's WikiText-103 model then)."),
            ("lm_assets_fingerprint", "", "Digest of lm_assets_uri's listing from the preflight "
             "step; not read, it only makes the cache key change when the language models do. "
             "Recorded in the model metadata."),
            ("tensorboard_dir", "", "Folder (gs:// or local) of TensorBoard logs, one point per "
             "epoch: lm/<field> and classifier/<field> for each field of the training history "
             "(train_loss, valid_loss, metrics, seconds), the step counting each model's "
             "epochs; empty: $AIP_TENSORBOARD_LOG_DIR (this task's sub-folder), else none (the "
             "model folder holds only the files above)."),
            ("hypertune_metric", "", "Set by the trials of a Vertex tuning job: the "
             "classifier's epoch value (e.g. f1_score, valid_loss) reported to the tuning "
             "service after each of its epochs; empty reports nothing."),
        ],
        runs="components.train_text.component:train_step")


train_text_classifier = written_step()
