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
