"""Request workloads: arrival times and token counts, as numpy arrays (never one object per
request).

Arrivals are Poisson (exponential gaps), gamma (gaps with a coefficient of variation `cv`:
above 1 bursty, below 1 smoother than Poisson) or read from a trace file (CSV or Parquet with
`arrival_s`, `input_tokens`, `output_tokens`). Lengths are fixed, log-normal (median and the
standard deviation of the log, clipped to [min, max]) or the trace's. `stratified` draws (the
fluid level's capacity run) take log-normal lengths at a low-discrepancy sequence of
probability levels (from a random start: consecutive requests' levels a fixed stride apart,
_R2) rather than at random ones: every run of consecutive requests, the whole run's or the
part of it a measurement window takes, has the distribution's mean and spread, to a
fraction of a percent, not a sample's (3,000 random draws' mean output is off by a percent
or two; a window's prompts by more). `length_mean` is that mean.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from statistics import NormalDist

import numpy as np
import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.parquet as pq

from clustersim.hardware import limits
from clustersim.hardware.units import format_duration
from clustersim.scenario.reading import TooLarge, read_bounded, regular_file_problem
from clustersim.scenario.serving import MAX_REQUEST_TOKENS, LengthSpec, RequestWorkloadSpec
from clustersim.serving.load import rescale_arrivals

__all__ = ["Requests", "generate_requests", "read_request_trace", "check_request_trace",
           "TraceError", "length_mean"]

TRACE_COLUMNS = ("arrival_s", "input_tokens", "output_tokens")


class TraceError(ValueError):
    """A request trace that cannot be used (missing, unreadable, bad columns or values)."""


@dataclass(frozen=True)
class Requests:
    """One deployment's requests, in arrival order."""

    arrival_s: np.ndarray  # float64
    input_tokens: np.ndarray  # int64
    output_tokens: np.ndarray  # int64

    def __len__(self) -> int:
        return len(self.arrival_s)


def check_request_trace(path: Path) -> int | None:
    """Refuse, before reading it, a trace that is not a regular file (a named pipe blocks
    forever), is larger than limits.MAX_REQUEST_TRACE_BYTES or, for Parquet, has more rows
    than limits.MAX_REQUEST_TRACE_ROWS (from its footer); returns the rows when known."""
    problem = regular_file_problem(path, limits.MAX_REQUEST_TRACE_BYTES, "a request trace file")
    if problem:
        raise TraceError(f"{path}: {problem}")
    if path.suffix.lower() != ".parquet":
        return None
    try:
        rows = pq.ParquetFile(path).metadata.num_rows
    except (pa.ArrowException, OSError) as error:
        raise TraceError(f"cannot read {path}: {error}") from None
    if rows > limits.MAX_REQUEST_TRACE_ROWS:
        raise TraceError(f"{path} has {rows:,} rows; expected at most "
                         f"{limits.MAX_REQUEST_TRACE_ROWS:,} (docs/limits.md)")
    return rows


def read_request_trace(path: Path) -> dict[str, np.ndarray]:
    """The trace's columns as arrays; TraceError with what is wrong: columns missing or given
    twice, not plain numbers (booleans, timestamps and text are refused, not converted),
    token counts that are not whole or beyond the longest sequence, too many rows."""
    if not path.is_file():
        raise TraceError(f"no such file: {path}")
    check_request_trace(path)
    try:  # bounded: a /proc file behind a link says 0 bytes and may never end
        data = pa.BufferReader(read_bounded(path, limits.MAX_REQUEST_TRACE_BYTES))
        if path.suffix.lower() == ".parquet":
            table = pq.read_table(data)
        else:
            table = pacsv.read_csv(data)
    except TooLarge as error:
        raise TraceError(f"{path}: {error}") from None
    except (pa.ArrowException, OSError) as error:
        raise TraceError(f"cannot read {path}: {error}") from None
    if table.num_rows > limits.MAX_REQUEST_TRACE_ROWS:
        raise TraceError(f"{path} has {table.num_rows:,} rows; expected at most "
                         f"{limits.MAX_REQUEST_TRACE_ROWS:,} (docs/limits.md)")
    missing = [c for c in TRACE_COLUMNS if c not in table.column_names]
    if missing:
        raise TraceError(f"{path} lacks column(s) {', '.join(missing)}; expected "
                         f"{', '.join(TRACE_COLUMNS)}")
    out = {}
    for column in TRACE_COLUMNS:
        if table.column_names.count(column) > 1:
            raise TraceError(f"{path}: column {column} appears more than once")
        kind = table.schema.field(column).type
        if not (pa.types.is_integer(kind) or pa.types.is_floating(kind)
                or (pa.types.is_null(kind) and table.num_rows == 0)):
            raise TraceError(f"{path}: column {column} is {kind}; expected plain numbers "
                             f"({'seconds' if column == 'arrival_s' else 'token counts'})")
        try:
            values = table.column(column).to_numpy(zero_copy_only=False).astype(np.float64)
        except (pa.ArrowException, ValueError, TypeError):
            raise TraceError(f"{path}: column {column} is not numeric") from None
        if len(values) and not np.all(np.isfinite(values)):
            raise TraceError(f"{path}: column {column} has an empty, NaN or infinite value")
        low = 0 if column == "arrival_s" else 1
        if len(values) and values.min() < low:
            raise TraceError(f"{path}: column {column} has {values.min():g}; expected at "
                             f"least {low}")
        if column != "arrival_s" and len(values):
            if values.max() > MAX_REQUEST_TOKENS:
                raise TraceError(f"{path}: column {column} has {values.max():g} tokens; "
                                 f"expected at most {MAX_REQUEST_TOKENS:,} (docs/limits.md)")
            if not np.all(values == np.floor(values)):
                raise TraceError(f"{path}: column {column} has a count that is not whole")
        out[column] = values
    if len(out["arrival_s"]) == 0:
        raise TraceError(f"{path} has no requests")
    return out


def _arrivals(spec: RequestWorkloadSpec, horizon_s: float, rng: np.random.Generator,
              rate: float | None = None) -> np.ndarray:
    rate = float(spec.rate_per_s or 0.0) if rate is None else rate
    limit = spec.requests if spec.requests is not None else None
    expected = rate * horizon_s
    chunk = int(min(limit or expected, expected) * 1.05 + 64)
    parts: list[np.ndarray] = []
    last = 0.0
    count = 0
    while True:
        if spec.arrival == "poisson":
            gaps = rng.exponential(1.0 / rate, chunk)
        else:
            shape = 1.0 / spec.cv**2
            gaps = rng.gamma(shape, 1.0 / (rate * shape), chunk)
        times = last + np.cumsum(gaps)
        parts.append(times)
        count += len(times)
        last = float(times[-1])
        if last >= horizon_s or (limit is not None and count >= limit):
            break
    arrivals = np.concatenate(parts)
    arrivals = arrivals[arrivals < horizon_s]
    return arrivals[:limit] if limit is not None else arrivals


def length_mean(spec: LengthSpec) -> float | None:
    """The mean token count of a length distribution as drawn (log-normal: clipped to [min,
    max] and rounded to the nearest integer); None for a trace's. For a log-normal X, the
    draw exceeds k (min <= k < max) when X >= k + 1/2, so the mean is min plus the sum of
    P(X >= k + 1/2): exact over the first _EXACT_TOKENS counts, and past them the integral of
    P(X >= x), in closed form (the rounding moves nothing there)."""
    if spec.distribution == "fixed":
        return float(spec.value)
    if spec.distribution != "lognormal":
        return None
    mu, sigma = math.log(spec.median), spec.sigma
    normal = NormalDist()

    def survival(x: float) -> float:
        return normal.cdf((mu - math.log(x)) / sigma)

    split = min(spec.max, spec.min + _EXACT_TOKENS)
    total = spec.min + math.fsum(survival(k + 0.5) for k in range(spec.min, split))
    if split < spec.max:  # the integral of P(X >= x) over [split, max]
        def partial(x: float) -> float:  # x P(X >= x) + E[X; X < x]
            return x * survival(x) + math.exp(mu + sigma**2 / 2) * normal.cdf(
                (math.log(x) - mu - sigma**2) / sigma)
        total += partial(spec.max) - partial(split)
    return total


# Stratified draws' strides, prompts' and outputs': the R2 sequence (Roberts 2018: 1/g and
# 1/g^2, g the plastic number, the real root of x^3 = x + 1), whose points fill the unit square
# evenly in every run of consecutive requests (a prompt's and its output's levels together).
_PLASTIC = 1.324717957244746
_R2 = (1.0 / _PLASTIC, 1.0 / _PLASTIC**2)
_EXACT_TOKENS = 1 << 16  # length_mean's exact sum: past it, the density is smooth per token


def _lengths(spec: LengthSpec, n: int, rng: np.random.Generator,
             trace: np.ndarray | None, stratified: bool = False,
             stride: float = 0.0) -> np.ndarray:
    if spec.distribution == "fixed":
        assert spec.value is not None
        return np.full(n, spec.value, dtype=np.int64)
    if spec.distribution == "trace":
        assert trace is not None
        values = np.rint(trace[:n]).astype(np.int64)
    else:
        assert spec.median is not None and spec.sigma is not None
        if stratified:  # quantiles at a low-discrepancy sequence of levels (module docstring)
            levels = (rng.random() + stride * np.arange(n)) % 1.0
            normal = NormalDist(math.log(spec.median), spec.sigma)
            logs = np.array([normal.inv_cdf(level) if 0 < level < 1 else
                             math.copysign(math.inf, level - 0.5) for level in levels.tolist()])
        else:
            logs = rng.normal(np.log(spec.median), spec.sigma, n)
        # Clipped as floats: exp() of a wide draw overflows int64 (it became 1 token).
        draws = np.exp(logs)
        return np.rint(np.clip(draws, spec.min, spec.max)).astype(np.int64)
    return np.clip(values, spec.min, spec.max)


def generate_requests(spec: RequestWorkloadSpec, horizon_s: float, seed: np.random.SeedSequence,
                      base_dir: Path | None = None,
                      load: tuple[np.ndarray, float] | None = None,
                      stratified: bool = False) -> Requests:
    """The deployment's requests over [0, horizon_s), from its own seed stream. `load`:
    (requests per second per step, the step) of a load curve (clustersim.serving.load);
    `stratified`: log-normal lengths drawn stratified (module docstring)."""
    arrival_rng, input_rng, output_rng = (np.random.default_rng(s) for s in seed.spawn(3))
    trace = None
    if spec.trace is not None:
        path = Path(spec.trace)
        if not path.is_absolute() and base_dir is not None:
            path = base_dir / path
        trace = read_request_trace(path)
    if spec.arrival == "trace":
        assert trace is not None
        order = np.argsort(trace["arrival_s"], kind="stable")
        trace = {k: v[order] for k, v in trace.items()}
        arrivals = trace["arrival_s"]
        keep = arrivals < horizon_s
        if len(arrivals) and not keep.any():
            # (a run of no requests would pass for one of an idle deployment)
            raise TraceError(f"none of the trace's {len(arrivals):,} arrivals falls within "
                             f"the deployment's {format_duration(horizon_s)} (the first at "
                             f"{format_duration(float(arrivals[0]))}); expected arrival_s in "
                             "seconds from the deployment's start, or a longer duration")
        if spec.requests is not None:
            keep &= np.arange(len(arrivals)) < spec.requests
        trace = {k: v[keep] for k, v in trace.items()}
        arrivals = trace["arrival_s"]
    elif load is not None:  # a unit-rate process, time-rescaled onto the curve
        rates, step_s = load
        total = float(np.sum(rates) * step_s)
        unit = _arrivals(spec, total, arrival_rng, rate=1.0) if total > 0 else np.zeros(0)
        arrivals = rescale_arrivals(unit, rates, step_s)
        arrivals = arrivals[arrivals < horizon_s]
        if spec.requests is not None:
            arrivals = arrivals[: spec.requests]
    else:
        arrivals = _arrivals(spec, horizon_s, arrival_rng)
    n = len(arrivals)
    if trace is not None and n > len(trace["input_tokens"]):
        raise TraceError(f"the trace has {len(trace['input_tokens'])} requests' lengths, "
                         f"{n} arrivals need them")
    inputs = _lengths(spec.input_tokens, n, input_rng,
                      None if trace is None else trace["input_tokens"], stratified, _R2[0])
    outputs = _lengths(spec.output_tokens, n, output_rng,
                       None if trace is None else trace["output_tokens"], stratified, _R2[1])
    return Requests(np.ascontiguousarray(arrivals, dtype=np.float64), inputs, outputs)
