"""The transformer trainer past one pod on Kubeflow: a Kubeflow Trainer v2 TrainJob.

`spec` builds the TrainJob (through `kubeflow-trainer-api`'s typed models, Trainer 2.3),
`node` maps what Trainer's `torch-distributed` runtime gives each node onto what the
trainer reads, and `launcher` creates the job, follows it and always deletes it.
"""
