"""Notebook cells named as IPython names them: ``cell In[5], line 19`` for ``/tmp/ipykernel_<pid>/<hash>.py``.

Shared: the kernel names the cells in stacks, tracebacks and hang notices (``supervision/``), and every error of
ours names them in what IPython shows of it (``errors.NotebookLauncherError._render_traceback_``). Outside IPython
(or for other files) a text stays as it is.
"""

from __future__ import annotations

import re
import sys

# Linear in the text, whatever a rank sends (an exception's message is untrusted): a bare path is tried only where
# a token starts (the lookbehind), so a long run of path characters is one try, not one per character; a quoted
# path ends at its line's end and is at most 4,096 characters long.
_CELL_REFERENCE = re.compile(r'File "(?P<quoted>[^"\n]{1,4096})", line (?P<line>\d+)|'
                             r'(?P<bare>(?<![^\s"\'(])[^\s"\'(]+\.py|<accelerate cell In\[\d+\]>):(?P<at>\d+)')
_MAGIC_CELL = re.compile(r"<accelerate cell In\[(\d+)\]>")  # a %%accelerate cell (magic.py names it so)


def _cell_files() -> dict[str, int]:
    """The cell files this kernel's IPython compiled (file name -> execution count); {} outside IPython."""
    if "IPython" not in sys.modules:
        return {}
    try:
        from IPython import get_ipython

        shell = get_ipython()
        return dict(getattr(getattr(shell, "compile", None), "_filename_map", None) or {})
    except Exception:  # noqa: BLE001 - naming cells is a nicety; the paths stay as they are
        return {}


def cell_names(text: str) -> str:
    """``File "/tmp/ipykernel_1/2.py", line 19`` and ``/tmp/ipykernel_1/2.py:19`` of a cell this kernel ran
    (and a ``%%accelerate`` cell's ``<accelerate cell In[5]>``), written as IPython writes them:
    ``cell In[5], line 19``. Outside IPython, or for other files, as they are."""
    if not text or ("<accelerate cell" not in text and "IPython" not in sys.modules):
        return text
    cells = _cell_files()

    def named(match: re.Match) -> str:
        file, line = (match["quoted"], match["line"]) if match["quoted"] else (match["bare"], match["at"])
        magic = _MAGIC_CELL.fullmatch(file)
        number = magic[1] if magic else cells.get(file)
        return match[0] if number is None else f"cell In[{number}], line {line}"

    return _CELL_REFERENCE.sub(named, text)
