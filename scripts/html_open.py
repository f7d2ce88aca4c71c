"""Open an HTML report in headless Chromium (Debian's `chromium`): how long it takes, how
many plots it drew, any console error or uncaught exception, and optionally a screenshot.

    python scripts/html_open.py REPORT.html [--screenshot OUT.png] [--json]

The file is opened as a copy, with no name resolving (no network), and two small scripts
added: one at the top of <head> that records console.error calls, uncaught errors, rejected
promises and resources that failed to load; one at the end of <body>
that records when the page's scripts have run (`performance.now()`, the plots are drawn by
then) and how many Plotly plots are on the page. `open_s` is the wall time of the whole
browser run (start-up included); `drawn_ms` the page's own time to that point.
"""

from __future__ import annotations

import argparse
import html
import json
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

_PROBE = """<script>(function(){var errs=[];function keep(m){errs.push(String(m).slice(0,300));
document.documentElement.setAttribute('data-errors',JSON.stringify(errs));}
var e=console.error;console.error=function(){keep(Array.prototype.join.call(arguments,' '));
return e.apply(console,arguments);};
window.addEventListener('error',function(ev){var t=ev.target||{};
keep(ev.message||('failed to load '+(t.src||t.href||t.tagName)));},true);
window.addEventListener('unhandledrejection',function(ev){keep('rejected: '+ev.reason);});
document.documentElement.setAttribute('data-errors','[]');})();</script>"""
_END = """<script>document.documentElement.setAttribute('data-drawn-ms',
String(performance.now()));document.documentElement.setAttribute('data-plots',
String(document.querySelectorAll('.js-plotly-plot').length));</script>"""


def chromium() -> str | None:
    """The Chromium binary, or None when it is not installed."""
    return shutil.which("chromium") or shutil.which("chromium-browser")


def _command(binary: str, profile: str) -> list[str]:
    # No name resolves: the page must open without a network.
    return [binary, "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
            "--disable-extensions", f"--user-data-dir={profile}", "--enable-logging=stderr",
            "--v=0", "--host-resolver-rules=MAP * ~NOTFOUND"]


def open_report(path: Path, screenshot: Path | None = None, timeout_s: float = 180.0
                ) -> dict:
    binary = chromium()
    if binary is None:
        raise RuntimeError("chromium is not installed (apt-get install -y chromium)")
    text = Path(path).read_text(encoding="utf-8")
    if "<head>" not in text or "</body>" not in text:
        raise ValueError(f"{path}: not an HTML document with <head> and </body>")
    probed = text.replace("<head>", "<head>" + _PROBE, 1)
    head, _, tail = probed.rpartition("</body>")
    probed = head + _END + "</body>" + tail
    with tempfile.TemporaryDirectory(prefix="clustersim-html-") as folder:
        page = Path(folder) / "report.html"
        page.write_text(probed, encoding="utf-8")
        start = time.perf_counter()
        done = subprocess.run([*_command(binary, f"{folder}/profile"), "--dump-dom",
                               page.as_uri()], capture_output=True, text=True,
                              timeout=timeout_s, check=False)
        open_s = time.perf_counter() - start
        dom = done.stdout
        found = {name: re.search(rf'data-{name}="([^"]*)"', dom)
                 for name in ("errors", "drawn-ms", "plots")}
        if done.returncode != 0 or not all(found.values()):
            raise RuntimeError(f"chromium exit {done.returncode}, page not read: "
                               f"{done.stderr[-2000:]}")
        errors = json.loads(html.unescape(found["errors"].group(1)))
        errors += [line for line in done.stderr.splitlines() if "CONSOLE" in line and (
            "Uncaught" in line or "Failed to load resource" in line)]
        result = {"file": str(path), "size_bytes": len(text.encode("utf-8")),
                  "open_s": open_s, "drawn_ms": float(found["drawn-ms"].group(1)),
                  "plots": int(found["plots"].group(1)), "errors": errors}
        if screenshot is not None:
            shot = subprocess.run([*_command(binary, f"{folder}/profile"),
                                   f"--screenshot={Path(screenshot).resolve()}",
                                   "--window-size=1400,2200", "--hide-scrollbars",
                                   "--virtual-time-budget=5000", page.as_uri()],
                                  capture_output=True, text=True, timeout=timeout_s,
                                  check=False)
            if shot.returncode != 0 or not Path(screenshot).exists():
                raise RuntimeError(f"no screenshot: {shot.stderr[-2000:]}")
            result["screenshot"] = str(screenshot)
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("report", type=Path)
    parser.add_argument("--screenshot", type=Path)
    parser.add_argument("--json", action="store_true", help="print the result as JSON")
    args = parser.parse_args()
    result = open_report(args.report, args.screenshot)
    if args.json:
        print(json.dumps(result))
    else:
        print(f"{result['file']}: {result['size_bytes'] / 1e6:.1f} MB, opened in "
              f"{result['open_s']:.1f} s (scripts done at {result['drawn_ms'] / 1e3:.2f} s), "
              f"{result['plots']} plots, {len(result['errors'])} console errors")
        for error in result["errors"]:
            print("  " + error)
    return 1 if result["errors"] else 0


if __name__ == "__main__":
    sys.exit(main())
