"""What both text classifier trainers share, owned by neither.

`components.train_text` (fastai ULMFiT) and `components.train_transformer` (Hugging Face)
import this package, never each other (tests/test_structure.py): `contract` (the model
folder both write, how a text is read), `scores` (validation scores, the constant answer)
and `models` (either folder loaded as one kind of classifier). Like `components.formats`,
it imports contracts and `components.common` only, and frameworks inside functions.
"""
