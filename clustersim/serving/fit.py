"""Whether a deployment's replica has room for its KV cache, and if not, why: its weights (and
its draft's), the HBM `server.kv_reserve` holds back, or the sliding-window caches of its
`server.max_batch` sequences. The one weights-fit check of `run`, `validate`, --find-rate
and both serving levels (serving.simulate.check_serving_fit)."""

from __future__ import annotations

import math

from clustersim.scenario.loader import Issue, Scenario
from clustersim.scenario.serving import DeploymentSpec
from clustersim.scenario.serving_server import ServerSpec
from clustersim.serving.replica import DecodeCost
from clustersim.serving.request_fit import least_request_kv_tokens

__all__ = ["weights_fit_issue"]

_GIB = 2.0**30


def weights_fit_issue(scenario: Scenario, d: DeploymentSpec, cost: DecodeCost,
                      capacity: int) -> Issue | None:
    """The issue of a deployment that leaves no room in its share of HBM for one KV block,
    with the memory breakdown, or None: every request would be rejected (training's
    equivalent is check_fit). It names the cause: the weights when they and a block do not
    fit under the default reserve; otherwise `server.max_batch` when the weights fit and the
    sliding-window caches do not (the most sequences that fit), else `server.kv_reserve`
    (the largest that fits)."""
    server = d.server
    if capacity >= server.kv_block_tokens:
        return None
    target = cost.target
    draft = cost.draft.weight_bytes_per_chip() if cost.draft is not None else 0.0
    weights = target.weight_bytes_per_chip()
    usable = target.usable_hbm_bytes(server.kv_reserve)
    block = target.kv_bytes_per_token_per_chip() * server.kv_block_tokens
    windowed = target.windowed_cache_bytes_per_chip(server.max_batch)
    fixed = weights + draft + block
    at = f"serve.{scenario.serve.index(d)}"
    default = float(ServerSpec.model_fields["kv_reserve"].default)
    drafted = f", the draft's {draft / _GIB:.2f} GiB" if cost.draft is not None else ""
    if windowed:
        drafted += (f", the sliding-window layers' caches of max_batch {server.max_batch} "
                    f"sequences ({windowed / _GIB:.2f} GiB)")
    ranks_on_chip = min(scenario.hardware.chip.ranks, d.tp * d.pp)
    breakdown = (
        f"{weights / _GIB:.2f} GiB of {d.model.name} (tp {d.tp}, pp {d.pp}) on its busiest "
        f"chip (the shards of the {ranks_on_chip} rank{'s' if ranks_on_chip > 1 else ''} "
        f"there){drafted} and one KV block of {server.kv_block_tokens} tokens "
        f"({block / _GIB:.3f} GiB) against {usable / _GIB:.2f} GiB usable "
        f"({scenario.hardware.chip.hbm_bytes / _GIB:.0f} GiB of HBM, the replica's ranks' "
        f"share of the chip, less kv_reserve {server.kv_reserve:g})")
    if fixed > target.usable_hbm_bytes(min(server.kv_reserve, default)):
        # a smaller weight format than the deployment's own, if there is one
        smaller = {2.0: "fp8 weights, ", 1.0: "mxfp4 weights, ",
                   33 / 32: "mxfp4 weights, "}.get(target.element_bytes, "")
        return Issue(f"{at}.parallelism", f"the weights do not fit: {breakdown}; expected "
                     f"more tp or pp, {smaller}or a smaller model", dict(d.parallelism), True)
    # The weights fit under the default reserve: the reserve or the window caches leave no
    # room. The largest reserve holding everything, the most sequences at this reserve:
    # with room for the shortest request the scenario can send, not one block only (its
    # own check, serving.request_fit, would refuse that next).
    shortest = max(server.kv_block_tokens, least_request_kv_tokens(d) or 0)
    room = weights + draft + target.kv_bytes_per_token_per_chip() * shortest
    reserve = math.floor((1.0 - (room + windowed) / target.usable_hbm_bytes(0.0)) * 1000)
    lines = int((usable - room) // (windowed / server.max_batch)) if windowed else 0
    expected = []
    if lines >= 1:
        expected.append(f"server.max_batch at most {lines}")
    if 0 < reserve / 1000 < server.kv_reserve:
        expected.append(f"server.kv_reserve at most {reserve / 1000:g}")
    if not expected:
        expected.append("a lower server.kv_reserve and server.max_batch")
    if lines >= 1:
        return Issue(f"{at}.server.max_batch", f"the sliding-window caches do not fit beside "
                     f"the weights: {breakdown}; expected {' or '.join(expected)}",
                     server.max_batch, True)
    return Issue(f"{at}.server.kv_reserve", f"kv_reserve {server.kv_reserve:g} leaves no room "
                 f"for the KV cache: {breakdown}; expected {' or '.join(expected)}",
                 server.kv_reserve, True)
