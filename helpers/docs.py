"""Executed docs: every notebook run top to bottom and written as static HTML (figures as pictures, explorers as a
picture of their first state), plus an index page in notebook order with each notebook's run time on this machine.

`python -m helpers.docs --out docs` (or `make docs`). Writes OUT/NN_name.html, OUT/index.html and OUT/timings.json
(machine, library versions, date, seconds per notebook). A notebook that raises stops the build with its error.
"""

from __future__ import annotations

import argparse
import datetime
import html
import json
import os
import platform
import sys
import time
from importlib.metadata import version
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOKS = ROOT / "notebooks"
PRIORITY = ["image/png", "text/html", "text/markdown", "text/plain"]


def notebooks() -> list[Path]:
    """The numbered notebooks, in order."""
    return sorted(NOTEBOOKS.glob("[0-9][0-9]_*.ipynb"))


def title(nb) -> str:
    """A notebook's first heading (its title)."""
    for cell in nb.cells:
        if cell.cell_type == "markdown":
            for line in cell.source.splitlines():
                if line.startswith("# "):
                    return line[2:].strip()
    return ""


def build(out: Path, timeout: int = 600) -> dict:
    import nbformat
    from nbclient import NotebookClient
    from nbconvert import HTMLExporter

    out.mkdir(parents=True, exist_ok=True)
    exporter = HTMLExporter()
    exporter.exclude_input_prompt = True
    exporter.exclude_output_prompt = True
    record = {"device": f"CPU ({platform.machine()}, {os.cpu_count()} cores)", "python": platform.python_version(),
              "versions": {k: version(k) for k in ("torch", "transformers", "deepspeed", "jupyterlab", "nbconvert")},
              "date": datetime.datetime.now().isoformat(timespec="seconds"), "notebooks": []}
    for path in notebooks():
        nb = nbformat.read(path, as_version=4)
        started = time.perf_counter()
        NotebookClient(nb, timeout=timeout, kernel_name="python3",
                       resources={"metadata": {"path": str(NOTEBOOKS)}}).execute()
        seconds = time.perf_counter() - started
        exporter.config = _config()
        body, _ = exporter.from_notebook_node(nb)
        target = out / f"{path.stem}.html"
        target.write_text(body)
        record["notebooks"].append({"file": path.name, "title": title(nb), "html": target.name,
                                    "seconds": round(seconds, 1)})
        print(f"{path.name}: {seconds:.0f} s -> {target}", flush=True)
    (out / "timings.json").write_text(json.dumps(record, indent=1))
    (out / "index.html").write_text(_index(record))
    return record


def _config():
    from traitlets.config import Config

    c = Config()
    c.NbConvertBase.display_data_priority = PRIORITY      # widgets need require.js from a CDN: show their pictures
    return c


def _index(record: dict) -> str:
    rows = "\n".join(
        f"<tr><td><a href='{html.escape(n['html'])}'>{html.escape(n['file'])}</a></td><td>{html.escape(n['title'])}</td>"
        f"<td style='text-align:right'>{n['seconds']:.0f} s</td></tr>" for n in record["notebooks"])
    versions = ", ".join(f"{k} {v}" for k, v in record["versions"].items())
    return f"""<!doctype html><html><head><meta charset="utf-8"><title>Why did my run OOM? — executed notebooks</title>
<style>body{{font-family:sans-serif;max-width:60em;margin:2em auto}}td{{padding:.3em .8em}}</style></head><body>
<h1>Why did my run OOM? — executed notebooks</h1>
<p>Each notebook executed top to bottom in its default (scaled) mode; figures are pictures of their first state.
Run time on {html.escape(record['device'])}, {html.escape(record['date'])}; {html.escape(versions)}.</p>
<table><tr><th>notebook</th><th>title</th><th>run time</th></tr>
{rows}
</table></body></html>
"""


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m helpers.docs", description=__doc__.splitlines()[0])
    p.add_argument("--out", default=str(ROOT / "docs"), help="output folder (default docs/)")
    p.add_argument("--timeout", type=int, default=600, help="seconds a cell may run (default 600)")
    a = p.parse_args(argv)
    record = build(Path(a.out), a.timeout)
    total = sum(n["seconds"] for n in record["notebooks"])
    print(f"{len(record['notebooks'])} notebooks in {total:.0f} s; open {Path(a.out) / 'index.html'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
