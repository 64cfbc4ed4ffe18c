"""KFP face of the text training step: the typed signature mapped onto `train_text_classifier`."""

from kfp.dsl import Dataset, Input, Metrics, Model, Output


# Defaults written by python -m tools.signatures from contract.TrainConfig (edit there).
def train_text_classifier(
    dataset: Input[Dataset],
    model: Output[Model],
    metrics: Output[Metrics],
    lm_assets_uri: str = "",
    lm_assets_fingerprint: str = "",
    lang: str = "en",
    pretrained: bool = True,
    backwards: bool = False,
    lm_epochs: int = 4,
    epochs: int = 12,
    batch_size: int = 16,
    drop_mult: float = 0.3,
    threshold: float = 0.3,
    monitor: str = "f1_score",
    unfreeze: str = "auto",
    learning_rate: float = 0.0,
    lm_learning_rate: float = 0.002,
    seq_len: int = 72,
    min_freq: int = 3,
    max_vocab: int = 60000,
    mixed_precision: bool = True,
    model_config: str = "",
    seed: int = 42,
    tensorboard_dir: str = "",
    hypertune_metric: str = "",
):
    """Fine-tunes a language model on the texts, then trains a ULMFiT classifier (fastai AWD-LSTM).

    Args:
        dataset: Folder from the text preparation step: train/validation/test CSVs and manifest.json (labels, task).
        model: Output folder: `export.pkl` (fastai learner for `load_learner`), `labels.json` (labels, task, threshold, per-label tuned thresholds), `metrics.json` and `per_label_metrics.json` (validation figures per label at the fixed and tuned thresholds).
        metrics: Validation scalars: micro/macro F1 at the threshold and at tuned thresholds (multi-label), or accuracy and macro F1 (single-label); epochs and seconds per classifier epoch.
        lm_assets_uri: Root (gs:// or local) of pretrained LMs laid out as `<lang>/{forward,backward}/{config.json,vocab.pkl,weights.pth}` and `<lang>/spm/spm.model` for ja, ko, zh; needed when pretrained is true, except with lang=en (fastai's WikiText-103 model then).
        lm_assets_fingerprint: Digest of lm_assets_uri's listing from the preflight step; not read, it only makes the cache key change when the language models do. Recorded in the model metadata.
        lang: Language of the texts (en, fr, de, ...; ja, ko and zh use SentencePiece); picks the tokenizer and the assets folder.
        pretrained: Start from a pretrained LM: the one in lm_assets_uri (missing files are an error that lists them), or with lang=en and no lm_assets_uri fastai's WikiText-103 AWD-LSTM, downloaded as fastai does (stage a copy with python -m pipelines.stage_wt103 for jobs without internet); false trains from scratch.
        backwards: Read texts backwards (use the backward LM).
        lm_epochs: Language model fine-tuning epochs on the dataset's texts; 0 skips it.
        epochs: Classifier epochs (see unfreeze).
        batch_size: Texts per batch (language model and classifier).
        drop_mult: Multiplier of every AWD-LSTM dropout.
        threshold: Multi-label decision threshold on each label's probability.
        monitor: Metric whose best epoch is kept: valid_loss, f1_score (macro F1), accuracy_multi (multi-label) or accuracy (single-label).
        unfreeze: How a pretrained or LM-fine-tuned encoder is unfrozen: "gradual" (ULMFiT: head, top 2 groups, top 3, then everything, one epoch each, discriminative rates), "all" (everything from the first epoch at one rate), or "auto": gradual when an epoch has at least 50 batches, else all (on small data gradual stages are too short to learn). A random encoder always trains everything at once.
        learning_rate: Peak learning rate of the classifier's first stage (with gradual unfreezing, later stages use 1/2, 1/4, then 1/20 of it); 0 finds it with fastai's lr_find: its valley, held to 3e-3..5e-2 when gradual unfreezing trains the head first, else 3e-3..5e-3 times 1152/n_hid, capped at 5e-2; without a valley, the bounds' geometric middle.
        lm_learning_rate: Peak learning rate of the unfrozen language model epochs (its frozen first epoch uses 10x).
        seq_len: Tokens per backpropagation-through-time step.
        min_freq: Tokens seen fewer times in the training texts become xxunk.
        max_vocab: Largest vocabulary kept.
        mixed_precision: Train in mixed precision on a GPU: bf16 on compute capability 8.0 or more (A100, L4, H100), fp16 on 7.x (V100, T4); never on CPU.
        model_config: JSON object of AWD_LSTM settings (e.g. {"emb_sz": 400, "n_hid": 1152, "n_layers": 3}) when training from scratch; empty for fastai's defaults.
        seed: Seed of weights initialisation and batch order.
        tensorboard_dir: Folder (gs:// or local) of TensorBoard logs, one point per epoch: lm/<field> and classifier/<field> for each field of the training history (train_loss, valid_loss, metrics, seconds), the step counting each model's epochs; empty: $AIP_TENSORBOARD_LOG_DIR (this task's sub-folder), else none (the model folder holds only the files above).
        hypertune_metric: Set by the trials of a Vertex tuning job: the classifier's epoch value (e.g. f1_score, valid_loss) reported to the tuning service after each of its epochs; empty reports nothing.
    """
    import logging

    from components.text_common.scores import validation_scalars
    from components.train_text.contract import TrainConfig, parse_model_config
    from components.train_text.outputs import model_metadata
    from components.train_text.training import train_text_classifier as train

    logging.basicConfig(level=logging.INFO)  # one line per epoch in the job's log
    config = TrainConfig(
        lang=lang, pretrained=pretrained, backwards=backwards, lm_epochs=lm_epochs,
        epochs=epochs, batch_size=batch_size, drop_mult=drop_mult, threshold=threshold,
        monitor=monitor, unfreeze=unfreeze, learning_rate=learning_rate, lm_learning_rate=lm_learning_rate,
        seq_len=seq_len, min_freq=min_freq, max_vocab=max_vocab,
        mixed_precision=mixed_precision, model_config=parse_model_config(model_config),
        seed=seed,
    )
    result = train(dataset.path, model.path, config, lm_assets_uri=lm_assets_uri,
                   tensorboard_folder=tensorboard_dir, hypertune_metric=hypertune_metric or None)
    for name, value in validation_scalars(result).items():
        metrics.log_metric(name, float(value))
    model.metadata.update(model_metadata(result, config, model.path, dataset.path,
                                         lm_assets_uri, lm_assets_fingerprint))
