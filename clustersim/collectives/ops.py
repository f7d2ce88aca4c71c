"""Names shared by every collective module: operations, algorithms, errors, bus factors and
the HBM accesses a byte costs."""

from __future__ import annotations

__all__ = [
    "OPS",
    "ALGORITHMS",
    "NEURONLINK_KINDS",
    "FABRIC_KINDS",
    "COPY_ACCESSES",
    "REDUCE_ACCESSES",
    "CollectiveError",
    "normalise_op",
    "bus_factor",
]

OPS = ("all-reduce", "all-gather", "reduce-scatter", "all-to-all", "broadcast", "send-recv")
ALGORITHMS = ("auto", "ring", "biring", "mesh", "mesh1", "rdh", "kangaring", "hierarchical")
_OP_ALIASES = {
    "allr": "all-reduce", "all_reduce": "all-reduce", "allreduce": "all-reduce",
    "allg": "all-gather", "all_gather": "all-gather", "allgather": "all-gather",
    "redsct": "reduce-scatter", "reduce_scatter": "reduce-scatter",
    "reducescatter": "reduce-scatter",
    "alltoall": "all-to-all", "all_to_all": "all-to-all", "a2a": "all-to-all",
    "bcast": "broadcast", "sendrecv": "send-recv", "send_recv": "send-recv", "p2p": "send-recv",
}
NEURONLINK_KINDS = ("torus", "ring", "zring", "switch")
FABRIC_KINDS = ("efa", "uplink", "gateway", "intersite", "backbone")

# HBM accesses per byte a rank moves in one step (Neuron docs on KangaRing: a ring hop is
# one read and one write when copying, two reads and a write when reducing).
COPY_ACCESSES = 2
REDUCE_ACCESSES = 3


class CollectiveError(ValueError):
    """A collective that cannot run as asked (bad group, algorithm not applicable)."""


def normalise_op(op: str) -> str:
    """Canonical op name from the usual spellings (allr, all_reduce, all-reduce, ...)."""
    name = _OP_ALIASES.get(op.lower(), op.lower())
    if name not in OPS:
        raise CollectiveError(f"unknown collective {op!r}; expected one of {', '.join(OPS)}")
    return name


def bus_factor(op: str, ranks: int) -> float:
    """nccl-tests' bus bandwidth factor: busbw = algbw x factor."""
    op = normalise_op(op)
    if ranks <= 1:
        return 0.0 if op != "send-recv" else 1.0
    if op == "all-reduce":
        return 2 * (ranks - 1) / ranks
    if op in ("all-gather", "reduce-scatter", "all-to-all"):
        return (ranks - 1) / ranks
    return 1.0
