"""The base of every error of notebook_launcher's own, shared by both sides: the kernel's launch errors
(``errors.py``) and the one ranks raise (``DistributedOperationException``)."""

from __future__ import annotations

import os
import sys
import traceback

from .cells import cell_names

_PACKAGE_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep


class NotebookLauncherError(Exception):
    """Base of notebook_launcher's own errors."""

    raised_on_every_rank = False  # True: every rank raises it together (the kernel lets each report it)

    def _render_traceback_(self) -> list[str]:
        """What IPython shows for this error: the notebook's own frames down to the call, its cells named as
        IPython names them (``cell In[4], line 8``), then the message. The launcher's frames and IPython's own
        (``interactiveshell.py ... run_code``) add nothing to the story; a plain ``traceback.print_exc()`` or
        the run log has them all."""
        hidden = (_PACKAGE_DIR, *_ipython_dirs())
        frames = [frame for frame in traceback.extract_tb(self.__traceback__)
                  if not frame.filename.startswith(hidden)]
        text = "".join(["Traceback (most recent call last):\n", *traceback.format_list(frames),
                        *traceback.format_exception_only(type(self), self)])
        return cell_names(text).rstrip("\n").split("\n")


def _ipython_dirs() -> tuple[str, ...]:
    """The folder of IPython's package, where it is loaded (the shell's frames above a cell's)."""
    module = sys.modules.get("IPython")
    where = getattr(module, "__file__", None)
    return (os.path.dirname(os.path.abspath(where)) + os.sep,) if where else ()
