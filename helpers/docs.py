"""Executed docs: every notebook as static HTML (figures as pictures, explorers as a picture of their first state),
plus an index page in notebook order with each notebook's run time on this machine.

`python -m helpers.docs --out docs` (or `make docs`). Writes OUT/NN_name.html, OUT/index.html and OUT/timings.json
(machine, library versions, date, seconds per notebook). Notebooks are executed once: where `make test` has left
executed copies (nbmake --overwrite, in build/executed/notebooks/) newer than the sources, those are converted and
their run time read from the cells' own execution timestamps; otherwise each notebook is executed here, and one
that raises stops the build with its error. Cells marked collapsed in JupyterLab (metadata jupyter.outputs_hidden)
keep their output behind a "show" toggle, so the story reads first.
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
EXECUTED = ROOT / "build" / "executed" / "notebooks"
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


def executed_copy(path: Path, executed: Path = EXECUTED) -> Path | None:
    """The executed copy of a notebook that `make test` left, if it is newer than the source and complete."""
    import nbformat

    copy = executed / path.name
    if not copy.exists() or copy.stat().st_mtime < path.stat().st_mtime:
        return None
    nb = nbformat.read(copy, as_version=4)
    code = [c for c in nb.cells if c.cell_type == "code"]
    return copy if code and all(c.get("execution_count") for c in code) else None


def run_seconds(nb) -> float:
    """Wall time of an executed notebook, from its first cell's start to its last cell's reply (nbclient's stamps)."""
    from datetime import datetime as dt

    stamps = [c.metadata.get("execution", {}) for c in nb.cells if c.cell_type == "code"]
    starts = [s["iopub.execute_input"] for s in stamps if "iopub.execute_input" in s]
    ends = [s["shell.execute_reply"] for s in stamps if "shell.execute_reply" in s]
    if not starts or not ends:
        return float("nan")
    parse = lambda t: dt.fromisoformat(t.replace("Z", "+00:00"))
    return (parse(max(ends)) - parse(min(starts))).total_seconds()


def collapse_hidden_outputs(nb) -> None:
    """Outputs of cells collapsed in JupyterLab become one HTML block behind a <details> toggle."""
    import nbformat

    for cell in nb.cells:
        if cell.cell_type != "code" or not cell.metadata.get("jupyter", {}).get("outputs_hidden"):
            continue
        text = "".join(o.get("text", "") for o in cell.outputs if o.output_type == "stream" and o.name == "stdout")
        rest = [o for o in cell.outputs if not (o.output_type == "stream")]
        if not text:
            continue
        block = (f"<details><summary>show the output ({len(text.splitlines())} lines)</summary>"
                 f"<pre>{html.escape(text)}</pre></details>")
        cell.outputs = [nbformat.v4.new_output("display_data", data={"text/html": block})] + rest


def build(out: Path, timeout: int = 600, executed: Path = EXECUTED) -> dict:
    import re

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
        copy = executed_copy(path, executed)
        if copy is not None:
            nb = nbformat.read(copy, as_version=4)
            seconds, how = run_seconds(nb), f"executed by make test ({copy.relative_to(ROOT) if copy.is_relative_to(ROOT) else copy})"
        else:
            nb = nbformat.read(path, as_version=4)
            started = time.perf_counter()
            NotebookClient(nb, timeout=timeout, kernel_name="python3",
                           resources={"metadata": {"path": str(NOTEBOOKS)}}).execute()
            seconds, how = time.perf_counter() - started, "executed here"
        collapse_hidden_outputs(nb)
        exporter.config = _config()
        body, _ = exporter.from_notebook_node(nb)
        body = re.sub(r'href="(\d\d_\w+)\.ipynb"', r'href="\1.html"', body)    # links between notebooks
        target = out / f"{path.stem}.html"
        target.write_text(body)
        record["notebooks"].append({"file": path.name, "title": title(nb), "html": target.name,
                                    "seconds": round(seconds, 1), "how": how})
        print(f"{path.name}: {seconds:.0f} s ({how}) -> {target}", flush=True)
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
<p>Each notebook executed once, top to bottom, in its default (scaled) mode; figures are pictures of their first state.
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
