"""Numeric precision: the precisions a chip's peak is given for, and the bytes an element
takes in each (weights, activations, gradients, KV cache)."""

from __future__ import annotations

__all__ = ["PRECISIONS", "BYTES_PER_ELEMENT"]


PRECISIONS = ("fp32", "tf32", "bf16", "fp16", "fp8", "mxfp8", "mxfp4")
BYTES_PER_ELEMENT = {"fp32": 4, "tf32": 4, "bf16": 2, "fp16": 2, "fp8": 1}
