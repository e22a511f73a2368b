"""Render a tune's report.html once in headless Chromium and keep the screenshot (issue 17's check).

Runs ``autosync tune`` (objective time-to-loss, so lossy finalists get measured efficiency curves) on an
emulated cluster in a temporary directory, then ``chromium --headless --screenshot`` of the report it wrote.
Writes bench/results/report.html (the page itself), bench/results/report.png (the screenshot) and
bench/results/report_screenshot.md (the command, commit, date, and what the page holds).

    python bench/report_screenshot.py [--model tests/fixtures/small.py:build_wide] [--cluster 2x1@100mbit]
"""
from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from _results import RESULTS, write

ROOT = Path(__file__).resolve().parent.parent


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=str(ROOT / "tests" / "fixtures" / "small.py") + ":build_wide")
    ap.add_argument("--cluster", default="2x1@100mbit")
    ap.add_argument("--measure", type=int, default=5)
    ap.add_argument("--chromium", default=shutil.which("chromium") or shutil.which("chromium-browser"),
                    help="the browser (default: chromium on PATH; Debian's package)")
    args = ap.parse_args()
    if not args.chromium:
        sys.exit("no chromium on PATH (Debian: apt install chromium); nothing was run")
    with tempfile.TemporaryDirectory(prefix="autosync-report-") as d:
        tune = [sys.executable, "-m", "autosync.cli", "tune", "--model", args.model, "--cluster", args.cluster,
                "--measure", str(args.measure), "--confirm-rounds", "1", "--out", "strategy.yaml", "--data", "data",
                "--storage", f"sqlite:///{d}/tune.db"]
        out = subprocess.run(tune, cwd=d, capture_output=True, text=True)
        if out.returncode:
            sys.exit(f"tune failed ({out.returncode}): {out.stderr[-2000:]}")
        page = Path(d) / "strategy.html"
        shot = Path(d) / "report.png"
        subprocess.run([args.chromium, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
                        f"--screenshot={shot}", "--window-size=1200,2600", page.as_uri()],
                       check=True, capture_output=True, timeout=120)
        RESULTS.mkdir(parents=True, exist_ok=True)
        shutil.copy(page, RESULTS / "report.html")
        shutil.copy(shot, RESULTS / "report.png")
        text = page.read_text()
    sections = [s for s in ("Context", "Pick", "Every measured strategy", "Predicted vs measured",
                            "Loss against wall-clock time") if f"<h2>{s}</h2>" in text]
    write(RESULTS / "report_screenshot.md", [
        "# A tune's report.html, rendered in headless Chromium", "",
        f"`autosync tune --model {Path(args.model).name} --cluster {args.cluster} --measure {args.measure}` "
        "wrote the page; Chromium rendered it at 1200 px wide.", "",
        f"- page: [report.html](report.html) ({len(text) / 1024:.0f} KiB, self-contained: "
        f"{text.count('data:image/png')} inline plots, nothing fetched)",
        f"- sections: {', '.join(sections)}", "- screenshot:", "", "![report](report.png)"])
    print(f"wrote {RESULTS / 'report.png'} and {RESULTS / 'report.html'}")


if __name__ == "__main__":
    main()
