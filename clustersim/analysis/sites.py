"""A drawing of a multi-site cluster (`clustersim topology --draw` when there are sites):
each site a disc sized by its chips, labelled with its name, chips and leaves; the inter-site
links as lines labelled with bandwidth and latency; a shared backbone as a hub."""

from __future__ import annotations

import math
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only, no display

import matplotlib.pyplot as plt  # noqa: E402

from clustersim.hardware import units  # noqa: E402
from clustersim.hardware.topology import Topology  # noqa: E402

__all__ = ["draw_sites"]


def draw_sites(topology: Topology, path: str | Path) -> Path:
    """Draw the sites of a topology and the links between them to a PNG."""
    net = topology.sites
    assert net is not None
    n = net.count
    cpi = topology.hardware.chips_per_instance
    positions = [(math.cos(math.pi / 2 - 2 * math.pi * s / n),
                  math.sin(math.pi / 2 - 2 * math.pi * s / n)) for s in range(n)]
    fig, ax = plt.subplots(figsize=(7.5, 6.5))
    biggest = max(net.instances)
    for a in range(n):
        for b in range(a + 1, n):
            if not net.direct(a, b):
                continue
            (x1, y1), (x2, y2) = positions[a], positions[b]
            ax.plot([x1, x2], [y1, y2], color="#1565c0", linewidth=1.5, zorder=1)
            label = (f"{units.format_bandwidth(net.pair_bandwidth(a, b), bits=True)}\n"
                     f"{units.format_duration(net.pair_latency(a, b))}")
            ax.annotate(label, ((x1 + x2) / 2, (y1 + y2) / 2), ha="center", va="center",
                        fontsize=7, color="#0d47a1",
                        bbox={"boxstyle": "round", "fc": "white", "ec": "none", "alpha": 0.8})
    if net.backbone_bandwidth_bytes_per_s > 0:
        for x, y in positions:
            ax.plot([0, x], [0, y], color="#ef6c00", linewidth=1.2, linestyle="--", zorder=1)
        ax.scatter([0], [0], s=900, marker="s", color="#ef6c00", zorder=2)
        ax.annotate(f"backbone\n{units.format_bandwidth(net.backbone_bandwidth_bytes_per_s, bits=True)}"
                    f" per site\n{units.format_duration(net.backbone_latency_s)}", (0, -0.18),
                    ha="center", va="top", fontsize=7, color="#e65100")
    per_leaf = topology.fabric.leaf_size(topology.hardware.instances_per_ultraserver)
    for s, (x, y) in enumerate(positions):
        size = 600 + 2400 * net.instances[s] / biggest
        ax.scatter([x], [y], s=size, color="#2e7d32", zorder=3)
        ax.annotate(f"{net.names[s]}\n{net.instances[s] * cpi:,} chips\n"
                    f"{math.ceil(net.instances[s] / per_leaf):,} leaves, "
                    f"{topology.spines_per_site} spines", (1.42 * x, 1.3 * y),
                    ha="center", va="center", fontsize=8, fontweight="bold")
    bisection = units.format_bandwidth(topology.bisection_bytes_per_s(), bits=True)
    ax.set_title(f"{topology.hardware.name}: {topology.chips:,} chips over {n} sites "
                 f"(bisection {bisection})", fontsize=10)
    ax.set_xlim(-1.9, 1.9)
    ax.set_ylim(-1.7, 1.7)
    ax.set_aspect("equal")
    ax.set_axis_off()
    path = Path(path)
    fig.savefig(path, dpi=120, bbox_inches="tight")
    plt.close(fig)
    return path
