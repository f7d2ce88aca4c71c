"""What an instance price is: on-demand, a Capacity Block rate, an assumption or the scenario's.

The catalog's price of each entry carries its source and a note (`clustersim hardware NAME`);
the command line labels prices from them rather than calling every price "on-demand".
"""

from __future__ import annotations

from clustersim.hardware.catalog import HardwareSpec

__all__ = ["price_basis"]


def price_basis(hardware: HardwareSpec) -> str:
    """A few words saying what the instance price is, from its source and note."""
    source = hardware.source_of("instance.price_per_hour") or ""
    if source.startswith("scenario"):
        return "set in the scenario"
    if "capacity block rate" in source.lower():
        return "Capacity Block rate, an assumption"
    if source.startswith("PRICE"):
        return "on-demand, an assumption"
    return "assumed"
