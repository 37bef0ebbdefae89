"""Which matplotlib backend a notebook gets: live figures (ipympl, `%matplotlib widget`) where they work, pictures
(`%matplotlib inline`) elsewhere; the explorers work with either (helpers.explore redraws a picture into its output).

ipympl is left out where it is absent (JupyterLite, a bare Jupyter) and on Google Colab, whose ipywidgets it does not
work with (matplotlib/ipympl issue #587, googlecolab/colabtools issue #5425, both open). OOM_FIGURES=widget or inline overrides the choice.
"""

from __future__ import annotations

import importlib.util
import os
import sys

from helpers.errors import InputError

CHOICES = ("auto", "widget", "inline")


def live_figures_work() -> bool:
    """ipympl imports and this is not Colab."""
    if "google.colab" in sys.modules:
        return False
    try:
        import ipympl  # noqa: F401
    except ImportError:
        return False
    return True


def setup() -> str:
    """Select the backend in the running IPython kernel (outside one, nothing changes); returns 'widget' or 'inline'
    (or the current backend's name outside IPython)."""
    choice = os.environ.get("OOM_FIGURES", "auto").strip().lower() or "auto"
    if choice not in CHOICES:
        raise InputError(f"OOM_FIGURES must be one of {', '.join(CHOICES)}, got {choice!r}")
    if choice == "auto":
        choice = "widget" if live_figures_work() else "inline"
    if choice == "widget" and importlib.util.find_spec("ipympl") is None:   # pragma: no cover - a reader's choice
        raise InputError("OOM_FIGURES=widget needs ipympl (pip install ipympl), which is not installed")
    try:
        from IPython import get_ipython
    except ImportError:
        get_ipython = lambda: None      # noqa: E731
    shell = get_ipython()
    if shell is None or not hasattr(shell, "run_line_magic"):
        import matplotlib

        return matplotlib.get_backend()
    shell.run_line_magic("matplotlib", choice)
    return choice
