"""The pipeline definitions: what `compile.py` turns into the JSON users upload.

`image`, `text`, `transformer` and `lm` build one pipeline each (a local variant for
`kfp.local`, a Vertex one and a Kubeflow one), its body calling the steps that `steps` made
once for the build from the image and the settings; `machine` holds the machines both
targets read, `tuning` wraps a trainer in a Vertex tuning job, `vertex` places each step on
its machine (`kubeflow` in its pod, `trials` runs its tuning trials), `registry` uploads a
model that cleared the gate, `help_text` holds the pipeline parameters' help that is no
step's and each target's own words. The commands that run, submit, serve and predict
with them are the modules beside this package (`python -m pipelines.run_local`, ...); the
rehearsal of their compiled JSON is the package `rehearsal`.
"""
