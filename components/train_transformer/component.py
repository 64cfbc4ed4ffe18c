"""KFP face of the transformer training step: the typed signature mapped onto `launch.train`."""

from kfp.dsl import Dataset, Input, Metrics, Model, Output


# Defaults written by python -m tools.signatures from contract.TransformerConfig (edit there).
def train_transformer_classifier(
    dataset: Input[Dataset],
    model: Output[Model],
    metrics: Output[Metrics],
    model_name: str = "FacebookAI/xlm-roberta-base",
    model_fingerprint: str = "",
    epochs: int = 6,
    batch_size: int = 16,
    learning_rate: float = 5e-05,
    weight_decay: float = 0.01,
    warmup_ratio: float = 0.1,
    max_length: int = 256,
    threshold: float = 0.5,
    monitor: str = "loss",
    early_stopping_patience: int = 2,
    mixed_precision: bool = True,
    seed: int = 42,
    tensorboard_dir: str = "",
    hypertune_metric: str = "",
):
    """Fine-tunes a pretrained Hugging Face encoder end to end (transformers Trainer, PyTorch DDP across replicas and GPUs).

    Args:
        dataset: Folder from the text preparation step: train/validation/test CSVs and manifest.json (labels, task).
        model: Output folder: the model and tokenizer as save_pretrained writes them (config.json, model.safetensors, tokenizer files), `labels.json` (labels, task, threshold, per-label tuned thresholds, max_length), `metrics.json` (validation scores, per-epoch history) and `per_label_metrics.json`.
        metrics: Validation scalars: micro/macro F1 at the threshold and at tuned thresholds (multi-label), or accuracy and macro F1 (single-label); epochs and seconds per epoch.
        model_name: Hub model name (e.g. FacebookAI/xlm-roberta-base, google-bert/bert-base-uncased) or a folder (gs:// or local) written by save_pretrained; its classification head is replaced by one sized for the labels.
        model_fingerprint: Digest of a model_name folder's listing from the preflight step; not read, it only makes the cache key change when the folder does. Recorded in the model metadata.
        epochs: Most epochs (early stopping may end sooner).
        batch_size: Texts per batch on each GPU (or process).
        learning_rate: Peak AdamW learning rate: 5e-5 fine-tunes a pretrained encoder (a small one such as all-MiniLM-L6-v2 on a few hundred texts learns faster at 1e-4); a model trained from scratch needs about 1e-3.
        weight_decay: AdamW weight decay.
        warmup_ratio: Share of the steps the rate warms up over, linearly from 0; it then decays linearly to 0.
        max_length: Tokens of each text the model reads (longer texts are cut).
        threshold: Multi-label decision threshold on each label's probability.
        monitor: What picks the best epoch and stops training: loss (validation loss), micro_f1 or macro_f1.
        early_stopping_patience: Epochs without improvement of the monitored value before training stops; 0 never stops early.
        mixed_precision: bf16 on GPUs of compute capability >= 8.0 (A100, L4, H100), fp16 on 7.x (V100, T4); never on CPU.
        seed: Seed of the classification head's initialisation and the batch order.
        tensorboard_dir: Folder (gs:// or local) of TensorBoard logs, one point per epoch (classifier/<field>); empty: $AIP_TENSORBOARD_LOG_DIR (this task's sub-folder), else none.
        hypertune_metric: Set by the trials of a Vertex tuning job: the epoch value (e.g. micro_f1, valid_loss) reported to the tuning service after each epoch; empty reports nothing.
    """
    import dataclasses
    import logging
    import os

    from components.common.provenance import provenance
    from components.prepare_text.contract import MANIFEST
    from components.train_transformer.contract import TransformerConfig
    from components.train_transformer.launch import train, validation_scalars

    logging.basicConfig(level=logging.INFO)  # one line per epoch in the job's log
    config = TransformerConfig(
        model_name=model_name, epochs=epochs, batch_size=batch_size,
        learning_rate=learning_rate, weight_decay=weight_decay, warmup_ratio=warmup_ratio,
        max_length=max_length, threshold=threshold, monitor=monitor,
        early_stopping_patience=early_stopping_patience, mixed_precision=mixed_precision,
        seed=seed,
    )
    result = train(dataset.path, model.path, config, tensorboard_folder=tensorboard_dir or None,
                   hypertune_metric=hypertune_metric or None)
    if result is None:  # another replica: the primary's outputs are the step's (KFP writes
        return  # the executor output of workerpool0 only), and its files may not show here
    for name, value in validation_scalars(result).items():
        metrics.log_metric(name, float(value))
    model.metadata.update({
        "framework": "transformers",
        "arch": result["run"]["arch"],
        "task": result["task"],
        "labels": result["labels"],
        "model_fingerprint": model_fingerprint,
        "learnt_nothing": result["run"]["learnt_nothing"] or "",
        "files": sorted(os.listdir(model.path)),
        **provenance(os.path.join(dataset.path, MANIFEST), dataclasses.asdict(config)),
    })
