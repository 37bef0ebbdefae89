"""The README is the front door: its index of notebooks matches the notebooks, title for title."""

import re
from pathlib import Path

import nbformat

from helpers import docs

ROOT = Path(__file__).resolve().parent.parent


def test_readme_lists_every_notebook_with_its_own_title():
    text = (ROOT / "README.md").read_text()
    listed = re.findall(r"^\| \[(.+?)\]\(notebooks/(\d\d_\w+\.ipynb)\) \|", text, flags=re.M)
    files = [p.name for p in docs.notebooks()]
    assert [f for _, f in listed] == files
    for shown, name in listed:
        assert shown == docs.title(nbformat.read(ROOT / "notebooks" / name, as_version=4)), name


def test_notebooks_readme_describes_every_notebook():
    text = (ROOT / "notebooks" / "README.md").read_text()
    for p in docs.notebooks():
        assert f"`{p.name}`" in text, p.name


def test_notebooks_are_committed_without_outputs():
    for p in docs.notebooks():
        nb = nbformat.read(p, as_version=4)
        assert all(not c.get("outputs") and c.get("execution_count") is None for c in nb.cells if c.cell_type == "code"), p.name


def test_the_readmes_counts_are_the_data_files():
    """The figures the READMEs type in: the reports notebook 08 walks through, and the catalogue's models."""
    import json

    from helpers import models

    reports = len(json.loads((models.DATA_DIR / "oom_reports.json").read_text())["reports"])
    for readme in (ROOT / "README.md", ROOT / "notebooks" / "README.md"):
        assert f"{reports} real reports from public threads" in readme.read_text(), readme
    text = " ".join((ROOT / "README.md").read_text().split())
    assert f"({len(models.catalogue())} models:" in text and f"of the {len(models.catalogue())} catalogue models" in text
