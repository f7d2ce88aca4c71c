"""Draw the pictures of docs/analysis.md again:

    python scripts/docs_pictures.py

- docs/html-report.png: the top of the quickstart's `report --html` page, a screenshot in
  headless Chromium (Debian's `chromium`);
- docs/step-timeline.png: the trace `clustersim step --timeline` writes for the quickstart
  with four pipeline stages, drawn with matplotlib from the file (slices by category, flows
  from each send to its receive), what ui.perfetto.dev shows of it.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
PIPELINE = ["--set", "jobs.0.parallelism.pp=4", "--set", "jobs.0.parallelism.dp=128"]
COLOURS = {"compute": "#2e7d32", "tp": "#1565c0", "pp": "#00838f", "dp": "#8e24aa",
           "ep": "#c62828", "cp": "#6d4c41", "bubble": "#bdbdbd", "optimizer": "#ef6c00",
           "dp-overlapped": "#ce93d8"}


def clustersim(*args: str) -> None:
    subprocess.run([sys.executable, "-m", "clustersim", *args], check=True, cwd=ROOT,
                   capture_output=True, text=True)


def html_picture(folder: Path) -> Path:
    binary = shutil.which("chromium")
    if binary is None:
        raise SystemExit("chromium is not installed (apt-get install -y chromium)")
    run = folder / "quickstart"
    clustersim("run", "scenarios/quickstart.yaml", "-o", str(run))
    clustersim("report", str(run), "--html")
    target = DOCS / "html-report.png"
    subprocess.run([binary, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
                    f"--user-data-dir={folder / 'profile'}", "--window-size=1100,860",
                    "--force-device-scale-factor=1", "--virtual-time-budget=5000",
                    f"--screenshot={target}", (run / "report" / "report.html").as_uri()],
                   check=True, capture_output=True, text=True)
    return target


def timeline_picture(folder: Path) -> Path:
    path = folder / "step.json"
    clustersim("step", "scenarios/quickstart.yaml", *PIPELINE, "--timeline", str(path))
    trace = json.loads(path.read_text())
    events = trace["traceEvents"]
    names = {e["tid"]: e["args"]["name"] for e in events
             if e["ph"] == "M" and e["name"] == "thread_name"}
    tids = sorted(names)
    row = {tid: len(tids) - 1 - i for i, tid in enumerate(tids)}
    fig, ax = plt.subplots(figsize=(11, 3.6))
    seen = set()
    for e in events:
        if e["ph"] != "X" or e["cat"] == "pass":
            continue
        label = e["cat"] if e["cat"] not in seen else None
        seen.add(e["cat"])
        ax.barh(row[e["tid"]], e["dur"] / 1e3, left=e["ts"] / 1e3, height=0.7,
                color=COLOURS[e["cat"]], label=label, linewidth=0)
    starts = {e["id"]: e for e in events if e["ph"] == "s"}
    for e in events:
        if e["ph"] == "f" and e["id"] in starts:
            s = starts[e["id"]]
            ax.annotate("", xy=(e["ts"] / 1e3, row[e["tid"]] + 0.35),
                        xytext=(s["ts"] / 1e3, row[s["tid"]] - 0.35),
                        arrowprops={"arrowstyle": "-|>", "color": "#424242", "lw": 0.5,
                                    "mutation_scale": 6})
    short = {t: names[t].split(",")[0].replace("data-parallel gradient reduction", "DP")
             for t in tids}
    ax.set_yticks([row[t] for t in tids], [short[t] for t in tids], fontsize=7)
    ax.set_xlabel("ms from the step's start")
    about = trace["otherData"]["jobs"][0]
    ax.set_title(f"clustersim step --timeline: the quickstart with 4 pipeline stages, one "
                 f"step of {about['step_time_s']:.2f} s (arrows: sends to receives)",
                 fontsize=9)
    ax.legend(fontsize=7, ncol=9, loc="upper center", bbox_to_anchor=(0.5, -0.22),
              frameon=False)
    fig.tight_layout()
    target = DOCS / "step-timeline.png"
    fig.savefig(target, dpi=90)
    plt.close(fig)
    return target


def main() -> None:
    with tempfile.TemporaryDirectory(prefix="clustersim-docs-") as folder:
        for drawn in (timeline_picture(Path(folder)), html_picture(Path(folder))):
            print(f"wrote {drawn.relative_to(ROOT)} ({drawn.stat().st_size / 1024:.0f} KiB)")


if __name__ == "__main__":
    main()
