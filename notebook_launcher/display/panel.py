"""The live run panel: one output in the launching cell, updated from the events while the run goes on.

The output carries the state payload for the JupyterLab extension plus ``text/html`` and ``text/plain``
fallbacks (``fallback.py``), and is updated in place through its display id: at most ``MAX_UPDATES_PER_S``
times a second, fewer when the state is large (at most ``MAX_BYTES_PER_S`` go out), and every
``IDLE_UPDATE_S`` while nothing happens (the extension moves the elapsed clock itself in between, so a quiet
run sends next to nothing). The last update, made when the run ends, is what the saved notebook keeps.
"""

from __future__ import annotations

import json
import os
import time

from ..events import Event
from .fallback import render_html, render_text
from .protocol import FinishingDisplay
from .state import MIME_TYPE, RunState

MAX_UPDATES_PER_S = 4
MAX_BYTES_PER_S = 512 * 1024  # each update re-sends the whole state: many chatty ranks update less often
IDLE_UPDATE_S = 30.0  # the panel moves its clock itself; this says "still alive" when nothing else happens
DISPLAY_ENV_VAR = "NOTEBOOK_LAUNCHER_DISPLAY"
DISPLAYS = ("auto", "panel", "text")


def in_jupyter_kernel() -> bool:
    """True inside an IPython kernel that a frontend talks to (not terminal IPython, not plain Python)."""
    try:
        from IPython import get_ipython
    except ImportError:
        return False
    shell = get_ipython()
    return shell is not None and getattr(shell, "kernel", None) is not None


def wants_panel(display: str) -> bool:
    """``display="auto"``: the panel in a Jupyter kernel, text elsewhere; $NOTEBOOK_LAUNCHER_DISPLAY decides
    what "auto" means when it is set to "panel" or "text"."""
    if display == "auto":
        display = os.environ.get(DISPLAY_ENV_VAR, "auto").strip().lower() or "auto"
        if display not in DISPLAYS:
            display = "auto"
    if display == "auto":
        return in_jupyter_kernel()
    return display == "panel"


class PanelDisplay(FinishingDisplay):
    """A ``Display`` (``show``, ``note``, ``tick``, ``retarget``) whose ``finish`` publishes the end state."""

    def __init__(self, state: RunState, prefix_template: str = "[rank ${rank}] "):
        self.state = state
        self._prefix_template = prefix_template
        self._handle = None
        self._published_changes = -1
        self._published_at = 0.0
        self._interval = 1.0 / MAX_UPDATES_PER_S  # grows with the size of what an update sends
        self.updates = 0  # how many times the output was sent (for tests and benchmarks)

    def bundle(self) -> dict:
        payload = self.state.to_json()
        return {MIME_TYPE: payload, "text/html": render_html(payload, self._prefix_template),
                "text/plain": render_text(payload, self._prefix_template)}

    def show(self, event: Event) -> None:
        self.state.observe(event)
        self.tick()

    def note(self, text: str) -> None:
        self.state.note(text)
        self.tick()

    def retarget(self, node_rank: int, ranks) -> None:
        """The rendezvous gave this node its rank (c10d): the columns are its ranks."""
        self.state.set_ranks(ranks)

    def tick(self) -> None:
        """Publish if something changed and the last update is old enough, or if the clock should move."""
        now = time.monotonic()
        since = now - self._published_at
        changed = self.state.changes != self._published_changes
        if (changed and since >= self._interval) or since >= IDLE_UPDATE_S:
            self.publish()

    def publish(self, final: bool = False) -> None:
        from IPython.core.interactiveshell import InteractiveShell
        from IPython.display import display

        if not InteractiveShell.initialized():  # display="panel" outside IPython: the end state, as text
            if final:
                print(render_text(self.state.to_json(), self._prefix_template), flush=True)
            return
        bundle = self.bundle()
        size = len(json.dumps(bundle[MIME_TYPE])) + len(bundle["text/html"]) + len(bundle["text/plain"])
        self._interval = max(1.0 / MAX_UPDATES_PER_S, size / MAX_BYTES_PER_S)
        if self._handle is None:
            self._handle = display(bundle, raw=True, display_id=True)
        else:
            self._handle.update(bundle, raw=True)
        self._published_changes = self.state.changes
        self._published_at = time.monotonic()
        self.updates += 1

    def finish(self, status: str, **details) -> dict:
        """The run ended: publish its final state (what the saved notebook keeps) and return it."""
        self.state.finish(status, **details)
        self.publish(final=True)
        return self.state.to_json()
