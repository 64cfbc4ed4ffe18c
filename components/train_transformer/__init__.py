"""Fine-tunes a pretrained Hugging Face transformer on the prepared text split (PyTorch, DDP)."""
