"""An AWD-LSTM language model trained on a corpus, written as the text trainer's LM assets;
the assets and `lm_metrics.json` are published once every direction is done."""

from __future__ import annotations

import dataclasses
import logging
import os
import shutil
import time
from collections.abc import Sequence
from typing import Any

import numpy as np
import pandas as pd
from fastai.text.all import (
    Callback,
    SentencePieceTokenizer,
    awd_lstm_lm_config,
    defaults,
    load_pickle,
    save_pickle,
    set_seed,
)

from components.common import run_state
from components.common.fastai_text import (
    FP32,
    IS_VALID,
    find_rate,
    fit_sealed,
    lm_dataloaders,
    lm_learner,
    load_checkpoint,
    precision_here,
    run_folders,
)
from components.common.gpus import require_torch_gpus
from components.common.storage import TMP_PREFIX, write_json_atomically
from components.common.tensorboard import ScalarLog
from components.formats.lm_assets import (
    SPM_FILE,
    SPM_LANGS,
    direction,
    make_tokenizer,
    save_lm_assets,
)
from components.train_lm.contract import (
    MAX_FOUND_LR,
    METRICS_FILE,
    MIN_FOUND_LR,
    LMConfig,
    LMTrainingError,
)
from components.train_lm.corpus import Corpus, read_corpus
from components.train_lm.unigram import compare, unigram_baseline
from components.train_text.contract import model_config_problems

log = logging.getLogger(__name__)

STATE_FILE = "lm_state.json"
STATE_VERSION = 1
VOCAB_FILE = "vocab.pkl"
SPM_MODEL = "spm.model"
STAGING = "assets"  # in the checkpoint folder: directions finished so far
# The state file (`run_state.open_run`); a free folder loses another run's files.
STATE = run_state.StateFile(STATE_FILE, LMTrainingError, "other corpus, settings or output",
                            version=STATE_VERSION, leftovers=(VOCAB_FILE, SPM_MODEL, STAGING),
                            leftover_suffixes=(".pth", ".pth.tmp"))
_TEXT = "text"


def split_documents(count: int, fraction: float, seed: int) -> np.ndarray:
    """A seeded mask of the held-out documents: `fraction` of `count`, at least one held out
    and one left to train."""
    if count < 2:
        raise LMTrainingError(f"{count} document(s): nothing to hold out")
    held_out = min(count - 1, max(1, round(count * fraction)))
    mask = np.zeros(count, dtype=bool)
    mask[np.random.default_rng(seed).permutation(count)[:held_out]] = True
    return mask


def tensorboard_prefix(name: str) -> str:
    """Tag group of a direction's scalars: "lm" (forward) or "lm_backward"."""
    return "lm" if name == direction(False) else f"lm_{name}"


def _sentencepiece(resume: run_state.Resume, texts: Sequence[str], config: LMConfig,
                   scratch: str) -> str:
    """Trains the SentencePiece model of a ja/ko/zh corpus once; returns its path."""
    path = os.path.join(resume.folder, SPM_MODEL)
    if not resume.state["spm_saved"]:
        trainer = SentencePieceTokenizer(lang=config.lang, cache_dir=scratch,
                                         vocab_sz=config.spm_vocab_size or None)
        # The same rules as fastai's Tokenizer applies before the pieces are cut.
        try:
            trained = trainer.setup(list(texts), rules=defaults.text_proc_rules)["sp_model"]
        except RuntimeError as err:  # e.g. fewer pieces allowed than the corpus has characters
            raise LMTrainingError(
                f"SentencePiece could not be trained on this corpus with spm_vocab_size="
                f"{config.spm_vocab_size} ({err}); raise spm_vocab_size (0 lets fastai choose "
                "from the corpus)") from err
        shutil.copyfile(trained, path + ".tmp")
        os.replace(path + ".tmp", path)
        resume.state["spm_saved"] = True
        resume.save()
    return path


def _ids(items) -> np.ndarray:
    """The token ids of an LM loader's texts, one after another."""
    return np.concatenate([np.asarray(items[i]).ravel() for i in range(len(items))]
                          or [np.zeros(0, dtype=np.int64)])


def unigram_of(dls) -> dict[str, Any]:
    """`unigram_baseline` of a language model's loaders (the held-out one never shuffles)."""
    return unigram_baseline(_ids(dls.train.items), _ids(dls.valid.items), len(dls.vocab),
                            dls.valid.bs, dls.valid.seq_len)


def train_language_model(
    corpus_uri: str,
    output_dir: str,
    config: LMConfig,
    checkpoint_folder: str | None = None,
    callbacks: Sequence[Callback] = (),
    tensorboard_folder: str | None = None,
) -> dict[str, Any]:
    """Trains an AWD-LSTM language model per direction and writes the LM assets.

    Args:
        corpus_uri: CSV file, .txt file or folder of .txt files, local or gs://.
        output_dir: Folder that receives `<lang>/...` (the assets root) and `lm_metrics.json`.
        config: Training settings.
        checkpoint_folder: Where checkpoints and the state file go; default
            `run_state.checkpoint_folder(output_dir)`.
        callbacks: Extra fastai callbacks for every fit (the tests interrupt runs with one).
        tensorboard_folder: Folder of TensorBoard logs (`lm/<field>`, `lm_backward/<field>`);
            None or "": `tensorboard.log_folder`.

    Returns:
        The content of lm_metrics.json: `lang`, the forward model's `perplexity` and
        `accuracy`, `directions` (each one's figures, history, `unigram`, `beats_unigram`,
        `learnt_nothing`), `learnt_nothing`, `corpus`, `tokens`, `vocab_size`, `run`, `config`.

    Raises:
        LMTrainingError: A corpus or settings that cannot be trained.
    """
    require_torch_gpus()  # before anything is read: a job without its GPUs ends now
    started = time.monotonic()
    problems = model_config_problems(config.model_config, awd_lstm_lm_config)
    if problems:
        raise LMTrainingError("; ".join(problems))
    corpus: Corpus = read_corpus(corpus_uri, config.text_column)
    is_valid = split_documents(len(corpus.documents), config.validation_fraction, config.seed)
    frame = pd.DataFrame({_TEXT: corpus.documents, IS_VALID: is_valid})
    with run_folders(output_dir, checkpoint_folder, tensorboard_folder) as (
            folder, tensorboard, scratch):
        # This run's saved state, or a new one (another run's state is refused, its files go).
        resume = run_state.open_run(folder, STATE, {
            "config": dataclasses.asdict(config), "corpus": corpus.report["sha256"],
            "output": os.path.abspath(output_dir)}, fresh={
            "spm_saved": False, "vocab_saved": False, "directions": {}, "finished": False})
        if resume.resumed:
            log.info("resuming: %s",
                     {d: s["epochs_done"] for d, s in resume.state["directions"].items()})
        arch_config = {**awd_lstm_lm_config, **config.model_config}
        precision = precision_here(config.mixed_precision)
        staging = os.path.join(folder, STAGING)
        spm = None
        if config.lang in SPM_LANGS:
            spm = _sentencepiece(resume, frame[_TEXT][~frame[IS_VALID]], config, scratch)
        tokenizer = make_tokenizer(config.lang, spm, scratch)
        vocab = load_pickle(os.path.join(folder, VOCAB_FILE)) \
            if resume.state["vocab_saved"] else None
        for backwards in config.directions():
            mine = resume.state["directions"].setdefault(direction(backwards), {
                "epochs_done": 0, "checkpoint": None, "done": False, "found_lr": None,
                "history": []})
            if not mine["done"]:
                vocab = _train_direction(resume, mine, tensorboard, frame, tokenizer, vocab,
                                         config, backwards, arch_config, precision, staging,
                                         callbacks)
        result = _export(resume, staging, spm, output_dir, config, corpus, len(vocab),
                         precision, arch_config, started)
    return result


def _train_direction(resume: run_state.Resume, mine: dict, tensorboard: ScalarLog,
                     frame: pd.DataFrame, tokenizer, vocab: list | None, config: LMConfig,
                     backwards: bool, arch_config: dict[str, Any], precision: str,
                     staging: str, callbacks: Sequence[Callback]) -> list:
    """Trains one direction (or what is left of it) into its state `mine`, stages its assets;
    returns the vocabulary, saved when first made so every direction and resume numbers
    tokens alike."""
    name = direction(backwards)
    set_seed(config.seed + int(backwards))
    dls = lm_dataloaders(frame, _TEXT, tokenizer, vocab, config, backwards)
    if vocab is None:
        vocab = list(dls.vocab)
        save_pickle(resume.path(VOCAB_FILE), vocab)
        resume.state["vocab_saved"] = True
        resume.save()
    if mine.get("unigram") is None:
        mine["unigram"] = unigram_of(dls)
        resume.save()
    learn = lm_learner(dls, arch_config, config.drop_mult, resume.folder, precision)
    resumed = load_checkpoint(learn, resume, mine)
    # Found once: a resumed run keeps its rate.
    lr = config.learning_rate or find_rate(learn, resume, mine, "found_lr", MIN_FOUND_LR,
                                           MAX_FOUND_LR, config.epochs)
    log.info("%s language model: epochs %d..%d at peak rate %.2e", name,
             mine["epochs_done"] + 1, config.epochs, lr)

    fit_sealed(learn, config.epochs, lr, mine["epochs_done"], resume, mine, tensorboard, name,
               tensorboard_prefix(name), resumed, config.checkpoint_every_steps, callbacks)
    if precision != FP32:
        learn = learn.to_fp32()
    save_lm_assets(learn, staging, config.lang, backwards, arch_config)
    tokens = {"train": int(sum(dls.train.lens.coll)), "validation": int(sum(dls.valid.lens.coll))}
    checkpoint = mine["checkpoint"]
    mine.update(tokens=tokens, device=str(dls.device), done=True, checkpoint=None,
                parameters=sum(p.numel() for p in learn.model.parameters()))
    resume.save()
    resume.drop(checkpoint)
    return vocab


def _export(resume: run_state.Resume, staging: str, spm: str | None,
            output_dir: str, config: LMConfig, corpus: Corpus, vocab_size: int,
            precision: str, arch_config: dict[str, Any], started: float) -> dict[str, Any]:
    """Publishes the staged assets (with the SentencePiece model) and `lm_metrics.json`."""
    if spm:
        spm_target = os.path.join(staging, config.lang, SPM_FILE)
        os.makedirs(os.path.dirname(spm_target), exist_ok=True)
        shutil.copyfile(spm, spm_target)
    os.makedirs(output_dir, exist_ok=True)
    target = os.path.join(output_dir, config.lang)  # replaces an older one
    if os.path.exists(target):
        shutil.rmtree(target)
    temporary = os.path.join(output_dir, TMP_PREFIX + config.lang)
    shutil.copytree(os.path.join(staging, config.lang), temporary)
    os.replace(temporary, target)
    result = _result(resume.state, config, corpus, vocab_size, precision, arch_config,
                     time.monotonic() - started)
    write_json_atomically(os.path.join(output_dir, METRICS_FILE), result, sort_keys=False)
    resume.state["finished"] = True
    resume.save()
    return result


def _result(state: dict[str, Any], config: LMConfig, corpus: Corpus, vocab_size: int,
            precision: str, arch_config: dict[str, Any], seconds: float) -> dict[str, Any]:
    directions = {}
    for name, run in state["directions"].items():
        last = run["history"][-1] if run["history"] else {}
        seconds_per_epoch = [h["seconds"] for h in run["history"]]
        unigram = run.get("unigram")
        beats, nothing = compare(last.get("perplexity"), last.get("accuracy"), unigram)
        if nothing:
            log.warning("the %s language model learnt nothing: %s", name, nothing)
        directions[name] = {
            "valid_loss": last.get("valid_loss"), "perplexity": last.get("perplexity"),
            "accuracy": last.get("accuracy"),
            "unigram": None if unigram is None else {
                k: unigram[k] for k in ("perplexity", "accuracy", "valid_loss", "targets")},
            "beats_unigram": beats, "learnt_nothing": nothing,
            "epochs": len(run["history"]),
            "optimizer_steps": run.get("optimizer_steps", 0),  # earlier attempts' too
            "epoch_seconds": seconds_per_epoch,
            "epoch_cpu_seconds": [h.get("cpu_seconds") for h in run["history"]],
            "found_learning_rates": run["found_lr"],
            "history": run["history"]}
    forward, trained = directions[direction(False)], state["directions"][direction(False)]
    return {
        "lang": config.lang,
        "perplexity": forward["perplexity"],
        "accuracy": forward["accuracy"],
        # Why a direction's model is no better than a unigram model ("forward: ..."), or None.
        "learnt_nothing": "; ".join(f"{name}: {d['learnt_nothing']}"
                                    for name, d in directions.items()
                                    if d["learnt_nothing"]) or None,
        "directions": directions,
        "corpus": corpus.report,
        "tokens": trained["tokens"],
        "vocab_size": vocab_size,
        "run": {"parameters": int(trained["parameters"]), "device": trained["device"],
                "precision": precision,
                "arch": "AWD_LSTM", "arch_config": arch_config, "seconds": round(seconds, 3)},
        "config": dataclasses.asdict(config),
    }
