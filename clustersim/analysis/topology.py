"""Drawing a cluster's topology (`clustersim topology --draw`): chips, switches and links."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only, no display

import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
from matplotlib.patches import FancyArrowPatch  # noqa: E402

from clustersim.analysis.plotting import (
    _save,
)
from clustersim.hardware.topology import Topology  # noqa: E402

__all__ = [
    "draw_topology",
]


def draw_topology(topology: Topology, path: str | Path, max_chips: int = 144) -> Path:
    """Draw the first UltraServer (or instance) of a topology: chips on their torus grid, one
    panel per instance; NeuronLink links straight, torus wrap-arounds and Z rings bowed; a
    switch domain as a hub."""
    hw = topology.hardware
    shown = min(topology.chips, hw.chips_per_ultraserver, max_chips)
    chips = list(range(shown))
    link = hw.instance.interconnect
    positions: dict[int, tuple[float, float]] = {}
    colours = {"torus": "#1565c0", "ring": "#1565c0", "zring": "#ef6c00", "switch": "#9e9e9e"}
    switches: dict[int, tuple[float, float]] = {}
    instance_corner: dict[int, list[float]] = {}  # top-left chip of each instance drawn
    if link.topology == "switch":
        # Chips on a circle around their switch.
        for chip in chips:
            angle = 2 * np.pi * chip / shown
            positions[chip] = (3.0 * np.cos(angle), 3.0 * np.sin(angle))
        for chip in chips:
            switches.setdefault(topology._switch_of(chip), (0.0, 0.0))
    else:
        width = link.shape[0] if link.shape else hw.chips_per_instance
        height = link.shape[1] if link.shape else 1
        # Four instances (a Trn2 UltraServer) on a square in Z-ring order, so each Z link runs
        # to the next grid along a side of it; otherwise rows of six.
        square = [(0, 0), (1, 0), (1, 1), (0, 1)]
        for chip in chips:
            x, y = int(topology.chip_x[chip]), int(topology.chip_y[chip])
            instance = int(topology.chip_instance[chip])
            col, row = (square[instance] if hw.instances_per_ultraserver == 4
                        else (instance % 6, instance // 6))
            positions[chip] = (col * (width + 2.5) + x, -row * (height + 2.5) - y)
            corner = instance_corner.setdefault(instance, [positions[chip][0], positions[chip][1]])
            corner[0] = min(corner[0], positions[chip][0])
            corner[1] = max(corner[1], positions[chip][1])
    xs, ys = zip(*positions.values(), strict=True)
    span_x, span_y = max(xs) - min(xs) + 2, max(ys) - min(ys) + 3
    scale = min(1.0, 16 / (0.55 * span_x))
    fig, ax = plt.subplots(figsize=(max(4.0, 0.55 * span_x * scale),
                                    max(3.0, 0.55 * span_y * scale + 0.8)))
    drawn_kinds = set()
    for u, v, data in topology.graph.edges(chips, data=True):
        kind = data["kind"]
        if kind == "switch":
            chip, hub = (u, v) if u in positions else (v, u)
            if chip in positions and hub in switches:
                (x1, y1), (x2, y2) = positions[chip], switches[hub]
                ax.plot([x1, x2], [y1, y2], color=colours[kind], linewidth=1.2, zorder=1)
                drawn_kinds.add(kind)
            continue
        if u not in positions or v not in positions or kind not in colours:
            continue
        (x1, y1), (x2, y2) = positions[u], positions[v]
        wrap = kind != "zring" and (abs(x1 - x2) > 1.5 or abs(y1 - y2) > 1.5)
        if kind == "zring":
            # One Z ring (the chips at x = y = 0) drawn bold; the other fifteen faint, so the
            # rings stay legible.
            first = topology.chip_x[u] == 0 and topology.chip_y[u] == 0
            ax.add_patch(FancyArrowPatch(
                (x1, y1), (x2, y2), arrowstyle="-", color=colours[kind],
                connectionstyle="arc3,rad=0.12", linewidth=2.2 if first else 0.6,
                alpha=0.95 if first else 0.22, zorder=1.5 if first else 1))
            drawn_kinds.add(kind)
            continue
        if wrap:
            # Z links and torus wrap-arounds bow, so they do not run over other chips.
            ax.add_patch(FancyArrowPatch(
                (x1, y1), (x2, y2), arrowstyle="-", color=colours[kind],
                connectionstyle=f"arc3,rad={0.18 if kind == 'zring' else 0.35}",
                linewidth=0.9, alpha=0.55 if kind == "zring" else 0.7,
                linestyle=":" if wrap else "-", zorder=1))
        else:
            ax.plot([x1, x2], [y1, y2], color=colours[kind], linewidth=1.4, zorder=1)
        drawn_kinds.add(kind)
    labels = {"zring": "Z rings between instances (bold: the ring of the chips at x = y = 0)",
              "torus": "torus (dotted: wrap-around)",
              "ring": "ring", "switch": "link to the switch"}
    for kind in sorted(drawn_kinds):
        ax.plot([], [], color=colours[kind], label=labels[kind])
    for x, y in switches.values():
        ax.scatter([x], [y], s=900, marker="s", color="#424242", zorder=2)
        ax.annotate("switch", (x, y), ha="center", va="center", fontsize=7, color="white",
                    zorder=3)
    ax.scatter(xs, ys, s=180, color="#2e7d32", zorder=2)
    for chip, (x, y) in positions.items():
        ax.annotate(str(chip), (x, y), ha="center", va="center", fontsize=6, color="white",
                    zorder=3)
    for instance, (x, y) in sorted(instance_corner.items()):
        ax.annotate(f"instance {instance}", (x - 0.35, y + 0.75), fontsize=8, fontweight="bold",
                    ha="left", va="bottom")
    title = f"{hw.name} ({hw.instance.name}): {shown} chips"
    if hw.ultraserver is not None:
        title += f", {hw.instances_per_ultraserver} instances per UltraServer"
    ax.set_title(title, fontsize=10)
    if drawn_kinds:
        ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    ax.set_axis_off()
    ax.set_aspect("equal")
    bow = 0.6 * (max(xs) - min(xs)) * 0.18 if "zring" in drawn_kinds else 1.0
    ax.set_xlim(min(xs) - 1.2, max(xs) + 1.2)
    ax.set_ylim(min(ys) - max(1.2, bow), max(ys) + 1.2)
    return _save(fig, path, tight=False)
