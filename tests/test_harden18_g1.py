"""Harden 18 (g1): means over runs and replications count what did not occur as 0, say how
many replications define a figure, and say which population each answer is of."""

from __future__ import annotations

import math

from sweep_helpers import sweep_base, write_sweep

from clustersim.runner.sweep import run_sweep


def _rare_failures() -> dict:
    """One day of the sweep's base job with failures rare enough that some seeds have none."""
    base = sweep_base("1d")
    base["failures"]["scale"] = 20
    return base


def test_a_sweep_counts_a_cause_that_did_not_occur_as_zero(tmp_path):
    path = write_sweep(tmp_path, _rare_failures(), seeds=[0, 1, 2, 3],
                       variants=[{"name": "train", "set": {}},
                                 {"name": "renamed", "set": {"jobs.0.name": "other"}}])
    rows, summary = run_sweep(path, workers=1)
    mine = rows[rows["variant"] == "train"]
    causes = [c for c in rows if c.startswith("train.interruptions_by_cause.")]
    components = [c for c in rows if c.startswith("cluster.failures.")]
    assert causes and components
    # some seed had no interruption: its causes are 0 in the rows, not missing
    assert (mine["train.interruptions"] == 0).any()
    assert not mine[causes + components].isna().any().any()
    assert (mine[causes].sum(axis=1) == mine["train.interruptions"]).all()
    # the other variant has no job `train`: its figures stay missing, counts included
    assert rows.loc[rows["variant"] == "renamed", causes].isna().all().all()
    assert not rows.loc[rows["variant"] == "renamed", components].isna().any().any()
    # the mean of the causes over all four runs adds up to the mean of the interruptions
    row = summary[summary["variant"] == "train"].iloc[0]
    assert math.isclose(sum(row[c] for c in causes), row["train.interruptions"])
    for column in causes + components:
        assert math.isclose(row[column], mine[column].mean())
        assert math.isclose(row[f"{column}_ci95"],
                            3.182 * mine[column].std(ddof=1) / 2) or mine[column].nunique() == 1
