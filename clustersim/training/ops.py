"""The operations of one rank, as the step and serving models time them: matrix multiplies
and vector work, and the attention core of a layer (training.workload builds layers of
them; training.attention, training.experts and training.mean_layer the newer variants)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

__all__ = ["Op"]


@dataclass(frozen=True)
class Op:
    """One operation of one rank: a matrix multiply (m x k by k x n) or vector work."""

    name: str
    kind: Literal["matmul", "vector"]
    flops: float
    bytes: float  # HBM traffic
    m: int = 0
    n: int = 0
    k: int = 0
    count: int = 1  # identical operations (e.g. the heads of a batched matmul)
    grad_traffic: float = 2.0  # backward HBM traffic of vector work, relative to forward


def _matmul(name: str, m: int, k: int, n: int, element: int, count: int = 1) -> Op:
    flops = 2.0 * m * n * k * count
    traffic = float(element * (m * k + k * n + m * n) * count)
    return Op(name, "matmul", flops, traffic, m, n, k, count)


def _vector(name: str, elements: float, element: float, passes: float = 2.0,
            grad_traffic: float = 2.0) -> Op:
    """Elementwise work reading and writing `elements` values `passes` times in all."""
    return Op(name, "vector", 0.0, passes * elements * element, grad_traffic=grad_traffic)


def _attention_ops(b: int, s: int, heads: int, kv_heads: int, d: int, e: int, attention: str,
                   s_kv: int | None = None) -> list[Op]:
    """The attention core of one layer (after the QKV projection, before the output one):
    `s` query positions against `s_kv` key positions (all of them, `s`, unless context
    parallelism splits the queries)."""
    s_kv = s if s_kv is None else s_kv
    if attention == "flash":
        # One kernel: both GEMMs on chip; HBM sees Q, K, V read and the output written.
        flops = 4.0 * b * heads * s * s_kv * d
        traffic = float(e * b * (2 * heads * s + 2 * kv_heads * s_kv) * d)
        return [Op("attention", "matmul", flops, traffic, s, s_kv, d, b * heads)]
    scores = float(b) * heads * s * s_kv
    return [
        _matmul("scores", s, d, s_kv, e, count=b * heads),  # writes the scores
        # Fused scale-mask-softmax: reads the scores, writes the probabilities; backward
        # reads the output and its gradient and writes one (3 passes for 2).
        _vector("softmax", scores, e, passes=2, grad_traffic=1.5),
        # Dropout: reads, writes and writes a 1-byte mask; backward reads the gradient and
        # the mask and writes one (as many bytes as forward).
        _vector("dropout", scores, e, passes=2 + 1 / e, grad_traffic=1.0),
        _matmul("attend", s, s_kv, d, e, count=b * heads),  # reads them back
    ]
