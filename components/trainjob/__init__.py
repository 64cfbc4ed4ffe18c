"""A Kubeflow Trainer v2 TrainJob: its spec, its node contract, and its launcher."""
