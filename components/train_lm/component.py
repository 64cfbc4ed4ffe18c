"""KFP face of the language model step: `train_language_model` takes every field of
`contract.LMConfig` (its type, default and help, written from the class by
`components.common.written.step_function`) between its corpus and artifacts and its run
inputs."""

from kfp.dsl import Artifact, Metrics, Output

from components.common.written import settings_from_step, step_function
from components.train_lm.contract import LMConfig
from components.train_text.contract import parse_model_config


def train_step(values: dict) -> None:
    """The step's work: trains with the inputs' settings, logs the metrics, tags the assets.

    Args:
        values: Every input of `train_language_model`, by name.
    """
    import dataclasses
    import logging

    from components.train_lm.contract import console_metrics
    from components.train_lm.training import train_language_model as train

    logging.basicConfig(level=logging.INFO)  # one line per epoch in the job's log
    config = settings_from_step(LMConfig, values, {"model_config": parse_model_config})
    lm_assets, metrics = values["lm_assets"], values["metrics"]
    result = train(values["corpus_uri"], lm_assets.path, config,
                   tensorboard_folder=values["tensorboard_dir"])
    for name, value in console_metrics(result).items():
        metrics.log_metric(name, value)
    lm_assets.metadata.update({
        "framework": "fastai",
        "arch": "AWD_LSTM",
        "lang": config.lang,
        "directions": sorted(result["directions"]),
        "perplexity": result["perplexity"],
        # Why a direction is no better than a unigram model; the text pipeline refuses it.
        "learnt_nothing": result["learnt_nothing"] or "",
        "corpus": {k: result["corpus"][k] for k in ("uri", "documents", "sha256")},
        "corpus_fingerprint": values["corpus_fingerprint"],
        "config": dataclasses.asdict(config),
    })


def written_step(settings: type = LMConfig):
    """`train_language_model` written from `settings`."""
    return step_function(
        "train_language_model", settings,
        "Trains an AWD-LSTM language model on a corpus and writes it as pretrained LM assets.",
        before=[
            ("corpus_uri", str, "The corpus (gs:// or local): a folder of UTF-8 .txt files "
             "(each cut into paragraphs at blank lines), one .txt file, or a CSV file with a "
             "text column."),
            ("lm_assets", Output[Artifact], "Output folder, the assets root the text "
             "pipeline's lm_assets takes: `<lang>/forward/` (and `<lang>/backward/`) with "
             "config.json, vocab.pkl and weights.pth, `<lang>/spm/spm.model` for ja, ko and "
             "zh, and lm_metrics.json."),
            ("metrics", Output[Metrics], "Held-out perplexity and accuracy of the forward model "
             "(and the backward one), beside those of a unigram model of the same training "
             "tokens on the same held-out tokens (unigram_perplexity, unigram_accuracy; "
             "beats_unigram 1 or 0), tokens, vocabulary size and seconds per epoch."),
        ],
        after=[
            ("corpus_fingerprint", "", "Digest of the corpus listing from the preflight step; "
             "not read, it only makes the cache key change when the corpus changes."),
            ("tensorboard_dir", "", "Folder (gs:// or local) of TensorBoard logs, one point per "
             "epoch: lm/<field> (forward) and lm_backward/<field> for each field of the "
             "training history (train_loss, valid_loss, perplexity, accuracy, seconds), the "
             "epoch as step; empty: $AIP_TENSORBOARD_LOG_DIR (this task's sub-folder), else "
             "none (the assets folder holds only the files above)."),
        ],
        runs="components.train_lm.component:train_step")


train_language_model = written_step()
