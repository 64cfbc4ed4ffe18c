"""What both text classifier trainers share, owned by neither.

The fastai ULMFiT trainer (`components.train_text`) and the Hugging Face transformer
trainer (`components.train_transformer`) each import this package, never each other
(tests/test_structure.py):

- `contract`: the model folder both write (`labels.json`, `metrics.json`,
  `per_label_metrics.json`, `export.pkl` or `save_pretrained`'s files) and how a text is
  read (`clip_text`, `MAX_TEXT_CHARS`, `TEXT_FIELD`).
- `scores`: validation scores as both write them (the labels.json and per-label files),
  and the constant answer a classifier is judged against.
- `models`: either trainer's model folder loaded as one kind of classifier, for
  evaluation, prediction and serving.

Like `components.formats`, these modules import contracts and `components.common` only
(never a trainer), and their frameworks inside the functions that need them.
"""
