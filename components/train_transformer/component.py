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
    import logging

    from components.train_transformer.contract import TransformerConfig
    from components.train_transformer.launch import train
    from components.train_transformer.results import record_outputs

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
    record_outputs(result, model, metrics, dataset.path, config, model_fingerprint)


# Parameters after deadline_seconds written by python -m tools.signatures from
# train_transformer_classifier (edit there).
def train_transformer_trainjob(
    dataset: Input[Dataset],
    model: Output[Model],
    metrics: Output[Metrics],
    num_nodes: int,
    procs_per_node: int,
    gpus_per_node: int,
    cpu_per_node: str,
    memory_per_node: str,
    shm_per_node: str,
    node_selector: dict,
    tolerations: list,
    image_pull_secrets: list,
    storage_secret: str,
    storage_secret_keys: list,
    runtime: str,
    node_image: str,
    checkpoint_root: str,
    s3_endpoint: str,
    service_account: str,
    queue_name: str,
    pending_seconds: int,
    deadline_seconds: int,
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
    """Fine-tunes the transformer classifier across nodes: a Kubeflow Trainer TrainJob this pod creates, follows and deletes (Kubeflow only).

    Args:
        dataset: Folder from the text preparation step: train/validation/test CSVs and manifest.json (labels, task).
        model: Output folder, as the one-pod step writes it (the model node 0 wrote, copied here).
        metrics: Validation scalars, as the one-pod step logs them.
        num_nodes: Nodes of the TrainJob (pods, one machine each).
        procs_per_node: Processes per node: its GPUs, or 1.
        gpus_per_node: GPUs of each node (nvidia.com/gpu); 0 for CPU nodes.
        cpu_per_node: CPU of each node (a Kubernetes quantity; requests = limits).
        memory_per_node: Memory of each node (/dev/shm counts inside it).
        shm_per_node: Size of each node's memory-backed /dev/shm; empty: the container's own.
        node_selector: Node labels the nodes must have (GPU type, spot pool).
        tolerations: Tolerations of the nodes (key, operator, value, effect).
        image_pull_secrets: Secrets the nodes pull the image with.
        storage_secret: Kubernetes secret whose storage_secret_keys the nodes get as variables; empty for none.
        storage_secret_keys: Its keys whose values AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY get, in that order.
        runtime: The ClusterTrainingRuntime the job runs on (torch-distributed).
        node_image: The nodes' image (this step's).
        checkpoint_root: gs:// or s3:// folder of the checkpoints, TensorBoard logs, the model node 0 uploads and the staged dataset.
        s3_endpoint: S3 API URL of MinIO or Ceph for the nodes; empty: AWS.
        service_account: The nodes' Kubernetes service account; empty: this pod's.
        queue_name: Kueue LocalQueue the TrainJob is queued in (kueue.x-k8s.io/queue-name); empty: none.
        pending_seconds: Longest a node pod may wait to be scheduled before the step fails.
        deadline_seconds: Longest the TrainJob may run.
        model_name: As train_transformer_classifier's.
        model_fingerprint: As train_transformer_classifier's.
        epochs: As train_transformer_classifier's.
        batch_size: Texts per batch on each process.
        learning_rate: As train_transformer_classifier's.
        weight_decay: As train_transformer_classifier's.
        warmup_ratio: As train_transformer_classifier's.
        max_length: As train_transformer_classifier's.
        threshold: As train_transformer_classifier's.
        monitor: As train_transformer_classifier's.
        early_stopping_patience: As train_transformer_classifier's.
        mixed_precision: As train_transformer_classifier's.
        seed: As train_transformer_classifier's.
        tensorboard_dir: TensorBoard folder the nodes write to; empty: <checkpoint_root>/tensorboard.
        hypertune_metric: Not read: tuning trials stay one pod (the tuning variant refuses replicas on Kubeflow).
    """
    import dataclasses

    from components.train_transformer.contract import TransformerConfig
    from components.train_transformer.multinode import NodeSettings, train_on_nodes
    from components.train_transformer.results import record_outputs

    config = TransformerConfig(
        model_name=model_name, epochs=epochs, batch_size=batch_size,
        learning_rate=learning_rate, weight_decay=weight_decay, warmup_ratio=warmup_ratio,
        max_length=max_length, threshold=threshold, monitor=monitor,
        early_stopping_patience=early_stopping_patience, mixed_precision=mixed_precision,
        seed=seed,
    )
    settings = NodeSettings(
        num_nodes=num_nodes, procs_per_node=procs_per_node, gpus=gpus_per_node,
        cpu=cpu_per_node, memory=memory_per_node, shm=shm_per_node,
        node_selector=node_selector, tolerations=tolerations, image_pull_secrets=image_pull_secrets,
        storage_secret=storage_secret, secret_keys=storage_secret_keys, runtime=runtime,
        image=node_image, checkpoint_root=checkpoint_root, s3_endpoint=s3_endpoint,
        service_account=service_account, queue=queue_name, pending_seconds=pending_seconds,
        deadline_seconds=deadline_seconds)
    result = train_on_nodes(settings, dataset_uri=dataset.uri, dataset_path=dataset.path,
                            model_path=model.path, config=dataclasses.asdict(config),
                            tensorboard_dir=tensorboard_dir)
    record_outputs(result, model, metrics, dataset.path, config, model_fingerprint)
