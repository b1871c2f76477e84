"""The base of every error of notebook_launcher's own, shared by both sides: the kernel's launch errors
(``errors.py``) and the one ranks raise (``DistributedOperationException``)."""

from __future__ import annotations

import os
import traceback

_PACKAGE_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep


class NotebookLauncherError(Exception):
    """Base of notebook_launcher's own errors."""

    raised_on_every_rank = False  # True: every rank raises it together (the kernel lets each report it)

    def _render_traceback_(self) -> list[str]:
        """What IPython shows for this error: the notebook's own frames down to the call, then the message. The
        launcher's frames add nothing to the story (IPython would still show the one that raised); a plain
        ``traceback.print_exc()`` or the run log has them all."""
        frames = [frame for frame in traceback.extract_tb(self.__traceback__)
                  if not frame.filename.startswith(_PACKAGE_DIR)]
        text = "".join(["Traceback (most recent call last):\n", *traceback.format_list(frames),
                        *traceback.format_exception_only(type(self), self)])
        return text.rstrip("\n").split("\n")
