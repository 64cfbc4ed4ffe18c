"""The transformer trainer past one pod on Kubeflow: a Kubeflow Trainer v2 TrainJob.

`spec` builds the TrainJob (through `kubeflow-trainer-api`'s typed models, Trainer 2.3),
`contract` (the node contract) maps what Trainer's `torch-distributed` runtime gives each
node onto what the trainer reads, and `launcher` creates the job, follows it and always
deletes it. This package imports no step: the transformer step uses it (its node entry
point `components.train_transformer.node` reads the node contract; its launcher
`components.train_transformer.multinode` makes and runs the job).
"""
