"""What the plots share: state colours, time units and bins, legends and saving."""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")  # files only, no display

import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

__all__ = [
    "LOST_LABELS",
    "STATE_COLOURS",
    "bin_for",
    "format_bin",
    "time_unit",
]


STATE_COLOURS = {
    "running": "#2e7d32", "checkpointing": "#1565c0", "down": "#c62828",
    "waiting_for_hardware": "#ef6c00",
    "restarting": "#8e24aa", "restoring": "#00838f", "queued": "#9e9e9e",
    "requeued": "#616161",  # (lost time only: queued again after a preemption)
    "failed": "#212121", "repairing": "#6d4c41",
    "idle": "#e0e0e0", "inactive": "#f5f5f5", "done": "#bdbdbd", "serving": "#1e88e5",
}


LOST_LABELS = {"lost_work": "lost work", "checkpointing": "checkpointing",
               "down": "down", "waiting_for_hardware": "waiting for hardware",
               "restarting": "restarting", "restoring": "restoring", "queued": "queued",
               "requeued": "queued again"}


def _days(seconds: np.ndarray | float) -> np.ndarray | float:
    return np.asarray(seconds) / 86400.0


def _legend_outside(ax: plt.Axes, extra: dict[str, Any] | None = None) -> None:
    """One legend entry per label (bars drawn in pieces repeat theirs), in a compact row
    under the axes (beside them it took 40% of the width); `extra` adds entries (label:
    handle) for what was drawn without a label, e.g. markers."""
    handles, labels = ax.get_legend_handles_labels()
    unique = dict(zip(labels, handles, strict=True)) | (extra or {})
    if not unique:
        return
    longest = max(len(label) for label in unique)
    columns = max(1, min(len(unique), 6 if longest < 22 else 3 if longest < 45 else 1))
    # Below the tick labels and the x label, whatever the axes' height (in font sizes).
    below = 4.2 + 1.5 * ax.get_xlabel().count("\n")
    ax.legend(unique.values(), unique.keys(), loc="upper center", fontsize=8, frameon=False,
              ncol=columns, bbox_to_anchor=(0.5, 0.0), borderaxespad=below)


# Units for a time axis, by horizon: a 10-minute serving run in minutes, a month in days.
_TIME_UNITS = ((3 * 86400.0, 86400.0, "day"), (3 * 3600.0, 3600.0, "hour"),
               (180.0, 60.0, "minute"), (0.0, 1.0, "second"))


# Bin widths a reader can name, for plots over time.
_NICE_BINS_S = (1.0, 5.0, 10.0, 30.0, 60.0, 300.0, 600.0, 900.0, 1800.0, 3600.0, 3 * 3600.0,
                6 * 3600.0, 12 * 3600.0, 86400.0, 7 * 86400.0)


def time_unit(horizon_s: float) -> tuple[float, str]:
    """Seconds per unit and its name, for a time axis over `horizon_s`."""
    return next((unit, name) for above, unit, name in _TIME_UNITS if horizon_s >= above)


def bin_for(horizon_s: float, bins: int = 300, finest_s: float = 0.0) -> float:
    """A nameable bin width giving about `bins` bins over the horizon (at least `finest_s`):
    a month in 3-hour bins, a day in 5-minute bins, ten minutes in 5-second bins."""
    target = max(horizon_s / bins, finest_s)
    return next((b for b in _NICE_BINS_S if b >= target), target)


def format_bin(seconds: float) -> str:
    for unit, name in ((86400.0, "d"), (3600.0, "h"), (60.0, "min"), (1.0, "s")):
        if seconds >= unit and abs(seconds / unit - round(seconds / unit)) < 1e-9:
            return f"{seconds / unit:g} {name}"
    return f"{seconds:g} s"


def _save(fig: plt.Figure, path: str | Path, tight: bool = True) -> Path:
    """Write the figure as a PNG and free it: laid out tightly, or cropped to what is drawn
    (`tight=False`, for drawings without axes)."""
    if tight:
        with warnings.catch_warnings():
            # a note wider than the axes leaves tight_layout no room and it says so on
            # stderr; the bbox below grows the canvas to it, so the warning is noise
            warnings.filterwarnings("ignore", "Tight layout not applied", UserWarning)
            fig.tight_layout()
        # and the canvas grown to what is drawn: a bar's note longer than the room right of
        # it was cut at the figure's edge (hours.png, step.png)
        fig.savefig(path, dpi=110, bbox_inches="tight", pad_inches=0.1)
    else:
        fig.savefig(path, dpi=110, bbox_inches="tight")
    plt.close(fig)
    return Path(path)
