"""Fine-tunes a Hugging Face encoder with `Trainer`: the best epoch (by `monitor`) kept, a
checkpoint each epoch, each `checkpoint_every_steps` and at a SIGTERM's step (then exit 143).

Under DDP (`launch.py`) rank 0 alone writes the run state, the checkpoints' model (sealed
with every process's RNG state), the model folder and metrics; it sends the best epoch to
the others, which wait at a barrier until rank 0 has written every output.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import logging
import os
import pathlib
import shutil
import tempfile
import time
from collections.abc import Sequence
from typing import Any

import numpy as np

from components.common import preemption, run_state
from components.common.hf_transformers import import_transformers
from components.common.hypertune import TrialReporter
from components.common.input_kinds import folder_files
from components.common.metrics import multi_label_metrics, single_label_metrics
from components.common.precision import BF16, FP16, choose_precision
from components.common.storage import TMP_PREFIX, filesystem, is_remote, push_mirrors, read_json
from components.common.tensorboard import ScalarLog, epoch_scalars, log_folder
from components.prepare_text.contract import MULTI_LABEL, read_manifest, read_split
from components.text_common.contract import (
    MAX_TEXT_CHARS,
    clip_text,
    max_length_problem,
    tokenizer_problem,
)
from components.text_common.scores import (
    constant_answer,
    frequency_bias,
    learnt_nothing,
    validation_result,
    write_result_files,
)
from components.train_transformer.contract import (
    FRAMEWORK,
    TransformerConfig,
    TransformerTrainingError,
    model_folder_problem,
    model_name_is_path,
)

log = logging.getLogger(__name__)

RUN_FILE = "run.json"  # marks the run a checkpoint folder belongs to; `Trainer`'s hold state
RUN = run_state.StateFile(RUN_FILE, TransformerTrainingError,
                          "other settings, data or model folder", marker=True, sort_keys=True)
# Written by rank 0 into a checkpoint once every process has saved its part (its RNG
# state): only a sealed checkpoint is resumed.
SEALED_FILE = "sealed"
TRAINER_STATE = "trainer_state.json"  # `Trainer`'s state in each checkpoint
CLASSIFIER = "classifier"  # the history rows' model, as the fastai trainer's


def model_source(model_name: str, scratch: str) -> str:
    """What `from_pretrained` is given for `model_name`: a Hub name, a local folder, or a
    gs:// folder's copy in `scratch`; a path with no model in it is refused."""
    name = model_name.strip()
    if not model_name_is_path(name):
        return name
    problem = model_folder_problem(name, folder_files(name))
    if problem:
        raise TransformerTrainingError(problem)
    if not is_remote(name):
        return name
    local = os.path.join(scratch, "model")
    fs, root = filesystem(name)
    fs.get(root.rstrip("/") + "/", local + "/", recursive=True)
    return local


def run_values(config: TransformerConfig, manifest: dict[str, Any], model_dir: str
               ) -> dict[str, Any]:
    """What defines a run, for its fingerprint: another run's checkpoints are refused."""
    return {"config": dataclasses.asdict(config), "data": manifest.get("source"),
            "labels": manifest["labels"], "model_dir": os.path.abspath(model_dir)}


def claim_checkpoints(folder: str, values: dict[str, Any], write: bool = True) -> str | None:
    """The last sealed checkpoint of the run `values` defines (`run_values`) in `folder`, to
    resume from, or None. With `write` (rank 0 alone) it claims a free folder and removes the
    unsealed checkpoints a killed save left (`Trainer`'s rotation would keep them).

    Raises:
        TransformerTrainingError: The folder holds another run's checkpoints.
    """
    if not run_state.open_run(folder, RUN, values, write=write).resumed:
        return None
    for path in _checkpoints(folder).values():
        if write and not (path / SEALED_FILE).is_file():
            log.info("removing %s: its save did not finish", path)
            shutil.rmtree(path, ignore_errors=True)
    checkpoint = last_complete_checkpoint(folder)
    if checkpoint:
        _repoint_best(checkpoint)
    return checkpoint


def _repoint_best(checkpoint: str) -> None:
    """Points `checkpoint`'s state at this folder's copy of the best checkpoint: its path is
    the saving pod's, and `Trainer` drops a best checkpoint it cannot find."""
    state = read_json(os.path.join(checkpoint, TRAINER_STATE), optional=True) or {}
    best = state.get("best_model_checkpoint")
    here = best and os.path.join(os.path.dirname(checkpoint), os.path.basename(best))
    if best and not os.path.isdir(best) and os.path.isdir(here):
        log.info("resuming: the best checkpoint %s is %s in this folder", best, here)
        run_state.save(checkpoint, TRAINER_STATE, {**state, "best_model_checkpoint": here},
                       sort_keys=True)


def _checkpoints(folder: str) -> dict[int, pathlib.Path]:
    """`checkpoint-<step>` folders by step."""
    return {int(path.name.partition("-")[2]): path
            for path in pathlib.Path(folder).glob("checkpoint-*")
            if path.name.partition("-")[2].isdigit()}


def last_complete_checkpoint(folder: str) -> str | None:
    """The sealed `checkpoint-<step>` folder of the highest step, or None (a
    `trainer_state.json` does not say the other processes finished saving)."""
    sealed = {step: path for step, path in _checkpoints(folder).items()
              if (path / SEALED_FILE).is_file()}
    return str(sealed[max(sealed)]) if sealed else None


def seal_checkpoint(folder: str, step: int) -> None:
    """Marks `checkpoint-<step>` in `folder` complete once every process has saved its part;
    rank 0 first gathers the RNG states (`rng_state_<rank>.pth`) its copy lacks (other
    machines saved theirs in their own copies)."""
    checkpoint = pathlib.Path(folder, f"checkpoint-{step}")
    dist = _process_group()
    if dist and dist.get_world_size() > 1:
        mine = checkpoint / f"rng_state_{dist.get_rank()}.pth"
        states = [None] * dist.get_world_size() if _is_rank0() else None
        dist.gather_object((mine.name, mine.read_bytes()), states)
        for name, data in states or ():
            if not (checkpoint / name).exists():
                (checkpoint / name).write_bytes(data)
    if _is_rank0():
        (checkpoint / SEALED_FILE).write_text("")


def _is_rank0() -> bool:
    return int(os.environ.get("RANK", "0")) == 0  # torchrun's; a lone process has none


def _process_group():
    """`torch.distributed` while a process group is up, else None."""
    import torch.distributed as dist

    return dist if dist.is_available() and dist.is_initialized() else None


def epoch_history(log_history: Sequence[dict[str, Any]], multi: bool) -> list[dict[str, Any]]:
    """One row per evaluated epoch of `Trainer.state.log_history`, in the fastai trainer's
    names (`model`, `stage`, `epoch`, `train_loss`, `valid_loss`, `micro_f1`, `f1_score`,
    `accuracy_multi` or `accuracy`, `seconds`), so reports and tracking read both."""
    by_epoch: dict[int, dict[str, Any]] = {}
    for entry in log_history:
        if "epoch" not in entry:
            continue
        epoch = int(round(entry["epoch"]))
        row = by_epoch.setdefault(epoch, {"model": CLASSIFIER, "stage": 0, "epoch": epoch})
        if "loss" in entry:
            row["train_loss"] = float(entry["loss"])
        if "eval_loss" in entry:
            row["valid_loss"] = float(entry["eval_loss"])
            row["micro_f1"] = float(entry["eval_micro_f1"])
            row["f1_score"] = float(entry["eval_macro_f1"])
            row["accuracy_multi" if multi else "accuracy"] = float(entry["eval_accuracy"])
        if "epoch_seconds" in entry:
            row["seconds"] = float(entry["epoch_seconds"])
    return [by_epoch[e] for e in sorted(by_epoch) if "valid_loss" in by_epoch[e]]


def _probabilities(logits: np.ndarray, multi: bool) -> np.ndarray:
    import torch

    scores = torch.from_numpy(np.asarray(logits, dtype=np.float64))
    return (scores.sigmoid() if multi else scores.softmax(dim=1)).numpy()


def _scores(prediction, labels: Sequence[str], multi: bool, threshold: float
            ) -> dict[str, float]:
    """micro/macro F1 and accuracy of one evaluation (what `monitor` may name)."""
    probs = _probabilities(np.asarray(prediction.predictions), multi)
    truth = np.asarray(prediction.label_ids)
    if multi:
        result = multi_label_metrics(truth, probs, labels, threshold)
        accuracy = 1.0 - result["hamming_loss"]  # fastai's accuracy_multi
    else:
        result = single_label_metrics(truth.astype(int), probs, labels)
        accuracy = result["accuracy"]
    return {"micro_f1": float(result["micro_f1"]), "macro_f1": float(result["macro_f1"]),
            "accuracy": float(accuracy)}


def _encode(tokenizer, texts: Sequence[str], truth: np.ndarray, multi: bool, max_length: int
            ) -> list[dict[str, Any]]:
    """A dict per row for `Trainer`: the tokens and the target (0/1 row, else the class)."""
    targets = truth.astype(np.float32) if multi else truth.argmax(axis=1)
    encodings = tokenizer([clip_text(t) for t in texts], truncation=True,
                          max_length=max_length)
    return [{**{name: values[i] for name, values in encodings.items()}, "labels": target}
            for i, target in enumerate(targets)]


def _callbacks(transformers, config: TransformerConfig, scalars: ScalarLog,
               reporter: TrialReporter, multi: bool, notice: preemption.Notice,
               folder: str) -> list:
    """Epochs timed, logged, reported; checkpoints sealed and pushed, also at a SIGTERM's
    step (`Preempted` once sealed) and every `checkpoint_every_steps`; early stopping."""
    import torch
    import torch.distributed as dist

    def largest(value: int, device) -> int:
        flag = torch.tensor([value], device=device)
        dist.all_reduce(flag, op=dist.ReduceOp.MAX)
        return int(flag.item())

    class Run(transformers.TrainerCallback):
        started = None
        stopping = False

        def on_epoch_begin(self, args, state, control, **kwargs):
            self.started = time.monotonic()

        def on_step_end(self, args, state, control, **kwargs):
            many = _process_group() is not None and dist.get_world_size() > 1
            self.stopping = preemption.any_rank(
                notice.requested, (lambda value: largest(value, args.device)) if many else None)
            # The epoch's last step is evaluated and saved as every epoch is, then stopped.
            last_of_epoch = float(state.epoch).is_integer()
            due = preemption.due(state.global_step, config.checkpoint_every_steps)
            if (self.stopping or due) and not last_of_epoch:
                control.should_save = True

        def on_evaluate(self, args, state, control, metrics=None, **kwargs):
            seconds = time.monotonic() - (self.started or time.monotonic())
            # Into the history the checkpoint saves next: a resumed run keeps every epoch's.
            state.log_history.append({"epoch": state.epoch, "epoch_seconds": round(seconds, 3),
                                      "step": state.global_step})
            if not state.is_world_process_zero:
                return
            row = epoch_history(state.log_history, multi)[-1]
            log.info("epoch %d: %s", row["epoch"], {k: round(v, 4) for k, v in row.items()
                                                    if isinstance(v, float)})
            scalars.write(epoch_scalars(CLASSIFIER, row), row["epoch"])
            reporter.report(row, row["epoch"])

        def on_save(self, args, state, control, **kwargs):
            seal_checkpoint(args.output_dir, state.global_step)
            if state.is_world_process_zero:
                push_mirrors()  # a mirrored checkpoint folder (open-source Kubeflow)
            if self.stopping:
                raise preemption.Preempted(f"in {folder}/checkpoint-{state.global_step}")

    patience = config.early_stopping_patience
    return [Run(), *([transformers.EarlyStoppingCallback(patience)] if patience else [])]


def train_transformer(dataset_dir: str, model_dir: str, config: TransformerConfig, *,
                      tensorboard_folder: str | None = None, hypertune_metric: str | None = None,
                      checkpoints: str | None = None) -> dict[str, Any]:
    """Fine-tunes `config.model_name` on a prepared text dataset and writes the model folder.

    Args:
        dataset_dir: The text preparation step's folder (train/validation CSVs, manifest).
        model_dir: Output folder (see the contract); written by rank 0 only.
        config: The run's settings.
        tensorboard_folder: None: `AIP_TENSORBOARD_LOG_DIR`'s task folder, else no logs.
        hypertune_metric: History field reported to Vertex's tuning service each epoch.
        checkpoints: Checkpoint folder; None: `run_state.checkpoint_folder(model_dir)`.

    Returns:
        The validation result (`text_scores.validation_result`) plus `history`, `best`,
        `run` and `config`, as written to `metrics.json`.
    """
    transformers = import_transformers()
    started = time.monotonic()
    manifest, train, valid = _read_splits(dataset_dir)
    labels, task, text_column = manifest["labels"], manifest["task"], manifest["text_column"]
    multi = task == MULTI_LABEL
    folder = checkpoints or run_state.checkpoint_folder(model_dir)
    resume_from = claim_checkpoints(folder, run_values(config, manifest, model_dir),
                                    write=_is_rank0())
    cuda, precision = _device_precision(config)
    transformers.set_seed(config.seed)
    scratch = tempfile.mkdtemp(prefix=TMP_PREFIX)
    scalars = ScalarLog(log_folder(model_dir, tensorboard_folder))
    notice = preemption.Notice()
    try:
        tokenizer, model = _load_model(transformers, config, labels, multi, scratch)
        truth_train, truth_valid = train[labels].to_numpy(), valid[labels].to_numpy()
        start_at_label_frequencies(model, truth_train, task)
        train_set = _encode(tokenizer, train[text_column], truth_train, multi, config.max_length)
        valid_set = _encode(tokenizer, valid[text_column], truth_valid, multi, config.max_length)
        trainer = transformers.Trainer(
            model=model, args=_training_arguments(transformers, config, folder, precision, cuda),
            train_dataset=train_set, eval_dataset=valid_set,
            processing_class=tokenizer, compute_metrics=functools.partial(
                _scores, labels=labels, multi=multi, threshold=config.threshold),
            callbacks=_callbacks(transformers, config, scalars, TrialReporter(hypertune_metric),
                                 multi, notice, folder),
            data_collator=transformers.DataCollatorWithPadding(tokenizer))
        if resume_from:
            log.info("resuming from %s", resume_from)
        with notice:
            trainer.train(resume_from_checkpoint=resume_from)
        dist = _process_group()
        if dist:  # rank 0 alone loaded the best epoch (a mirror elsewhere lacks its model):
            for tensor in trainer.model.state_dict().values():  # every rank predicts with it
                dist.broadcast(tensor, src=0)
        probs = _probabilities(trainer.predict(valid_set).predictions, multi)
        result = validation_result(truth_valid, probs, labels, task, config.threshold)
        history = epoch_history(trainer.state.log_history, multi)
        result.update({
            "history": history,
            "best": best_epoch(trainer.state, config.monitor, history),
            "run": run_record(
                trainer, model, config, history, train_set, precision, started,
                rows={"train": len(train), "validation": len(valid)},
                texts_truncated=int(sum(len(t) > MAX_TEXT_CHARS for t in train[text_column])),
                resumed_from=resume_from, truth_valid=truth_valid, truth_train=truth_train,
                multi=multi),
            "config": dataclasses.asdict(config),
        })
        _save_model(trainer, model_dir, result, text_column, config)
    finally:
        scalars.close()
        shutil.rmtree(scratch, ignore_errors=True)
    if checkpoints is None and run_state.inside_output(folder, model_dir) and _is_rank0():
        shutil.rmtree(folder, ignore_errors=True)  # it would ship with the model
    if dist:  # rank 0 gets here once every output is written: the others wait for it
        dist.barrier()
        dist.destroy_process_group()
    return result


def _read_splits(dataset_dir: str) -> tuple[dict[str, Any], Any, Any]:
    """The manifest and the train and validation frames; refuses an empty split."""
    manifest = read_manifest(dataset_dir)
    train, valid = read_split(dataset_dir, "train"), read_split(dataset_dir, "validation")
    for name, frame in (("train", train), ("validation", valid)):
        if frame.empty:
            raise TransformerTrainingError(f"the {name} split of {dataset_dir} has no rows; "
                                           "give the preparation step more data")
    return manifest, train, valid


def _load_model(transformers, config: TransformerConfig, labels: Sequence[str], multi: bool,
                scratch: str):
    """The tokenizer and the classifier (a new head sized for `labels`) of `model_name`."""
    source = model_source(config.model_name, scratch)
    try:
        tokenizer = transformers.AutoTokenizer.from_pretrained(source)
        model = transformers.AutoModelForSequenceClassification.from_pretrained(
            source, num_labels=len(labels),
            problem_type="multi_label_classification" if multi
            else "single_label_classification",
            id2label=dict(enumerate(labels)), label2id={n: i for i, n in enumerate(labels)},
            ignore_mismatched_sizes=True)  # the head is new: sized for these labels
    except OSError as err:
        raise TransformerTrainingError(
            f"cannot load model_name {config.model_name!r}: {err}. Give a Hub name this "
            "job can download, or a folder (gs:// or local) written by save_pretrained"
        ) from err
    settings = model.config.to_dict()
    problem = (tokenizer_problem(len(tokenizer), settings, config.model_name)
               or max_length_problem(config.max_length, settings,
                                     tokenizer.model_max_length, config.model_name))
    if problem:
        raise TransformerTrainingError(problem)
    return tokenizer, model


def _device_precision(config: TransformerConfig) -> tuple[bool, str]:
    """Whether a CUDA device is there, and the precision to train in on it."""
    import torch

    cuda = torch.cuda.is_available()
    return cuda, choose_precision(config.mixed_precision, cuda,
                                  torch.cuda.get_device_capability() if cuda else None)


def _training_arguments(transformers, config: TransformerConfig, folder: str, precision: str,
                        cuda: bool):
    """`Trainer`'s arguments: an evaluation and a checkpoint each epoch, the best loaded at
    the end by rank 0. `average_tokens_across_devices` off: else transformers 5 multiplies
    the batch-mean loss by the processes (too large a loss and gradient under DDP)."""
    monitor = "eval_loss" if config.monitor == "loss" else f"eval_{config.monitor}"
    return transformers.TrainingArguments(
        output_dir=folder, num_train_epochs=config.epochs,
        per_device_train_batch_size=config.batch_size,
        per_device_eval_batch_size=config.batch_size * 2,
        learning_rate=config.learning_rate, weight_decay=config.weight_decay,
        warmup_steps=config.warmup_ratio, lr_scheduler_type="linear",
        eval_strategy="epoch", save_strategy="epoch", logging_strategy="epoch",
        save_total_limit=2, load_best_model_at_end=_is_rank0(), metric_for_best_model=monitor,
        greater_is_better=config.monitor != "loss", bf16=precision == BF16,
        fp16=precision == FP16, use_cpu=not cuda, seed=config.seed, data_seed=config.seed,
        report_to="none", disable_tqdm=True, dataloader_num_workers=0,
        average_tokens_across_devices=False)


def run_record(trainer, model, config: TransformerConfig, history: list[dict[str, Any]],
               train_set, precision: str, started: float, *, rows: dict[str, int],
               texts_truncated: int, resumed_from: str | None, truth_valid: np.ndarray,
               truth_train: np.ndarray, multi: bool) -> dict[str, Any]:
    """The `run` part of metrics.json: data, model, device, how the run went, the constant
    answer's scores and whether the classifier learnt nothing beyond it (warned of)."""
    constant = constant_answer(truth_valid, truth_train, multi, config.threshold)
    nothing = learnt_nothing(history, constant)
    if nothing:
        log.warning("the classifier learnt nothing (%s): it still answers the label "
                    "frequencies whatever the text; train longer or at a higher "
                    "learning_rate", nothing)
    return {
        "rows": rows,
        "texts_truncated": texts_truncated,
        "max_text_chars": MAX_TEXT_CHARS,
        "train_tokens": int(sum(len(row["input_ids"]) for row in train_set)),
        "parameters": int(sum(p.numel() for p in model.parameters())),
        "arch": type(model).__name__,
        "model_name": config.model_name,
        "precision": precision,
        "device": str(trainer.args.device),
        "world_size": int(trainer.args.world_size),
        "resumed_from": resumed_from,
        "optimizer_steps": int(trainer.state.global_step),  # earlier attempts' included
        "classifier_epoch_seconds": [r.get("seconds") for r in history],
        "stopped_early": len(history) < config.epochs,
        "constant_answer": constant,
        "learnt_nothing": nothing,
        "seconds": round(time.monotonic() - started, 3),
    }


def best_epoch(state, monitor: str, history: list[dict[str, Any]]) -> dict[str, Any]:
    """The `best` part of metrics.json: the epoch of the trainer's best checkpoint."""
    checkpoint, epoch = state.best_model_checkpoint, None
    per_epoch = state.global_step / max(1, history[-1]["epoch"]) if history else 0
    if checkpoint and per_epoch:
        epoch = int(round(int(os.path.basename(checkpoint).rsplit("-", 1)[-1]) / per_epoch))
    return {"monitor": monitor, "value": state.best_metric, "epoch": epoch}


def _save_model(trainer, model_dir: str, result: dict[str, Any], text_column: str,
                config: TransformerConfig) -> None:
    """Writes the model folder: the model and tokenizer, labels and metrics (rank 0 only)."""
    trainer.save_model(model_dir)
    if trainer.is_world_process_zero():
        # Trainer's pickle of its arguments: not needed to load or serve the model.
        with contextlib.suppress(FileNotFoundError):
            os.remove(os.path.join(model_dir, "training_args.bin"))
        write_result_files(model_dir, result, text_column, config.threshold,
                           framework=FRAMEWORK, arch=result["run"]["arch"],
                           model_name=config.model_name, max_length=config.max_length)


def start_at_label_frequencies(model, truth: np.ndarray, task: str) -> None:
    """Sets the output bias (the last `Linear` with one output per label) to the label
    frequencies' log-odds (`text_scores.frequency_bias`): training starts at the constant
    answer, not at 0.5.

    Raises:
        TransformerTrainingError: No such layer (an architecture this trainer does not know).
    """
    import torch

    outputs = [m for m in model.modules()
               if isinstance(m, torch.nn.Linear) and m.out_features == truth.shape[1]]
    if not outputs or outputs[-1].bias is None:
        raise TransformerTrainingError(f"{type(model).__name__} has no output layer with a bias "
                                       f"and {truth.shape[1]} outputs to start from the label "
                                       "frequencies")
    with torch.no_grad():
        outputs[-1].bias.copy_(torch.as_tensor(frequency_bias(truth, task)))
