"""The pipeline definitions: what `compile.py` turns into the files users upload; one module
per pipeline kind, each building its local, Vertex and Kubeflow variants from `steps`."""
