"""KFP face of the language model step: the typed signature mapped onto `train_language_model`."""

from kfp.dsl import Artifact, Metrics, Output


# Defaults written by python -m tools.signatures from contract.LMConfig (edit there).
def train_language_model(
    corpus_uri: str,
    lm_assets: Output[Artifact],
    metrics: Output[Metrics],
    lang: str = "en",
    text_column: str = "text",
    backwards: bool = False,
    epochs: int = 10,
    batch_size: int = 64,
    seq_len: int = 72,
    learning_rate: float = 0.01,
    drop_mult: float = 0.3,
    min_freq: int = 3,
    max_vocab: int = 60000,
    spm_vocab_size: int = 0,
    validation_fraction: float = 0.1,
    mixed_precision: bool = True,
    model_config: str = "",
    seed: int = 42,
    corpus_fingerprint: str = "",
    tensorboard_dir: str = "",
):
    """Trains an AWD-LSTM language model on a corpus and writes it as pretrained LM assets.

    Args:
        corpus_uri: The corpus (gs:// or local): a folder of UTF-8 .txt files (each cut into paragraphs at blank lines), one .txt file, or a CSV file with a text column.
        lm_assets: Output folder, the assets root the text pipeline's lm_assets takes: `<lang>/forward/` (and `<lang>/backward/`) with config.json, vocab.pkl and weights.pth, `<lang>/spm/spm.model` for ja, ko and zh, and lm_metrics.json.
        metrics: Held-out perplexity and accuracy of the forward model (and the backward one), beside those of a unigram model of the same training tokens on the same held-out tokens (unigram_perplexity, unigram_accuracy; beats_unigram 1 or 0), tokens, vocabulary size and seconds per epoch.
        lang: Language of the corpus (en, fr, de, ...; ja, ko and zh are cut with a SentencePiece model trained here); names the assets folder, which the text pipeline's lang must match.
        text_column: Column of the texts when the corpus is a CSV file.
        backwards: Also train a backward model (texts read right to left), for the text pipeline's backwards=true (a backward classifier, or half of a bidirectional ensemble).
        epochs: Epochs of each direction's one-cycle schedule.
        batch_size: Token streams per batch.
        seq_len: Tokens per backpropagation-through-time step.
        learning_rate: Peak learning rate; 0 finds it with fastai's lr_find: its valley, held to 1e-3..3e-2; without a valley, the bounds' geometric middle.
        drop_mult: Multiplier of every AWD-LSTM dropout.
        min_freq: Tokens seen fewer times become xxunk.
        max_vocab: Largest vocabulary kept.
        spm_vocab_size: SentencePiece vocabulary size for ja, ko and zh; 0 lets fastai choose from the corpus.
        validation_fraction: Share of the documents held out to measure perplexity and accuracy.
        mixed_precision: Train in mixed precision on a GPU: bf16 on compute capability 8.0 or more (A100, L4, H100), fp16 on 7.x (V100, T4); never on CPU.
        model_config: JSON object of AWD_LSTM settings (e.g. {"emb_sz": 400, "n_hid": 1152, "n_layers": 3}); empty for fastai's defaults. Written to config.json, so the text pipeline builds the same encoder.
        seed: Seed of the held-out draw, initialisation and batch order.
        corpus_fingerprint: Digest of the corpus listing from the preflight step; not read, it only makes the cache key change when the corpus changes.
        tensorboard_dir: Folder (gs:// or local) of TensorBoard logs, one point per epoch: lm/<field> (forward) and lm_backward/<field> for each field of the training history (train_loss, valid_loss, perplexity, accuracy, seconds), the epoch as step; empty: $AIP_TENSORBOARD_LOG_DIR (this task's sub-folder), else none (the assets folder holds only the files above).
    """
    import dataclasses
    import logging

    from components.train_lm.contract import LMConfig, console_metrics
    from components.train_lm.training import train_language_model as train
    from components.train_text.contract import parse_model_config

    logging.basicConfig(level=logging.INFO)  # one line per epoch in the job's log
    config = LMConfig(
        lang=lang, text_column=text_column, backwards=backwards, epochs=epochs,
        batch_size=batch_size, seq_len=seq_len, learning_rate=learning_rate,
        drop_mult=drop_mult, min_freq=min_freq, max_vocab=max_vocab,
        spm_vocab_size=spm_vocab_size, validation_fraction=validation_fraction,
        mixed_precision=mixed_precision, model_config=parse_model_config(model_config),
        seed=seed,
    )
    result = train(corpus_uri, lm_assets.path, config, tensorboard_folder=tensorboard_dir)
    for name, value in console_metrics(result).items():
        metrics.log_metric(name, value)
    lm_assets.metadata.update({
        "framework": "fastai",
        "arch": "AWD_LSTM",
        "lang": lang,
        "directions": sorted(result["directions"]),
        "perplexity": result["perplexity"],
        # Why a direction is no better than a unigram model; the text pipeline refuses it.
        "learnt_nothing": result["learnt_nothing"] or "",
        "corpus": {k: result["corpus"][k] for k in ("uri", "documents", "sha256")},
        "corpus_fingerprint": corpus_fingerprint,
        "config": dataclasses.asdict(config),
    })
