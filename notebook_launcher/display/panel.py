"""The live run panel: one output in the launching cell, updated from the events while the run goes on.

The output carries the state payload for the JupyterLab extension plus ``text/html`` and ``text/plain``
fallbacks (``fallback.py``), cut to the saved-output budget (``budget.py``), and is updated in place through its
display id. Two ways, depending on who listens:

- a JupyterLab panel that opened a comm for this run (``comm.py``) gets the full state once, then at most
  ``DELTAS_PER_S`` deltas a second (``FEW_RANKS_DELTAS_PER_S`` up to 8 ranks): what changed (``delta.py``),
  every new line; the MIME output is then
  refreshed only every ``REFRESH_S`` (cut to ``LIVE_BYTES``) and at the end (cut to ``SAVED_BYTES``);
- without one (Colab, Kaggle, VS Code, classic Notebook, nbconvert, a kernel without frontend), the MIME output
  is the live view: at most ``MAX_UPDATES_PER_S`` updates a second, fewer when it is large (``MAX_BYTES_PER_S``),
  each cut to ``FALLBACK_LIVE_BYTES``; and one every ``FALLBACK_IDLE_S`` while nothing happens, so that its clock
  and a hang's seconds move (a few KB a second for a small run, at most ``FALLBACK_LIVE_BYTES / FALLBACK_IDLE_S``).

A listening panel moves its clock itself: it gets a delta every ``IDLE_UPDATE_S`` while nothing happens. The last
MIME update, made when the run ends and cut to ``SAVED_BYTES``, is what the saved notebook keeps.
"""

from __future__ import annotations

import json
import os
import re
import time

from ..schema.events import DISPLAY, Event
from ..schema.wiretext import wire_safe
from .budget import SAVED_BYTES, bounded_bundle
from .comm import PanelChannel, panel_channel, send
from .delta import DeltaTracker
from .fallback import render_html, render_text
from .protocol import FinishingDisplay
from .rich import RankOutputs
from .state import MIME_TYPE, RunState

MAX_UPDATES_PER_S = 4
MAX_BYTES_PER_S = 512 * 1024  # each update re-sends the whole state: many chatty ranks update less often
DELTAS_PER_S = 5
FEW_RANKS_DELTAS_PER_S = 8  # up to 8 ranks (columns, not the grid) deltas are small: more of them, as smooth as before
REFRESH_S = 10.0  # with a listening panel, the MIME output (what is saved, what others show) is this old at most
LIVE_BYTES = 16_000  # ... and this large while the run goes on
IDLE_UPDATE_S = 30.0  # the panel moves its clock itself; this says "still alive" when nothing else happens
FALLBACK_IDLE_S = 2.0  # without a listening panel, the output's clock moves this often at least
FALLBACK_LIVE_BYTES = 64_000  # ... and each of its updates before the end is cut to this (the end's to SAVED_BYTES)
TICK_EVERY_S = 0.02  # a burst of events looks at the listeners once per this, not once per event
_UNSET = object()
DISPLAY_ENV_VAR = "NOTEBOOK_LAUNCHER_DISPLAY"
DISPLAYS = ("auto", "panel", "text")
_SURROGATE = re.compile("[\ud800-\udfff]")  # a lone one: jupyter_client's packer and print() raise on it


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

    def __init__(self, state: RunState, prefix_template: str = "[rank ${rank}] ", channel=_UNSET):
        self.state = state
        self.tracker = DeltaTracker(state)
        self._prefix_template = prefix_template
        self._channel: PanelChannel | None = None if channel is _UNSET else channel
        self._find_channel = channel is _UNSET
        self._handle = None
        self._published_changes = -1
        self._published_at = 0.0
        self._interval = 1.0 / MAX_UPDATES_PER_S  # grows with the size of what an update sends
        self._delta_changes = -1
        self._delta_at = 0.0
        self._ticked_at = -1.0
        self.updates = 0  # how many times the MIME output was sent (for tests and benchmarks)
        self.deltas = 0  # how many deltas went to listening panels
        self.last_bundle: dict | None = None  # the MIME bundle last published
        self.rich = RankOutputs(prefix_template.replace("${rank}", "0"))  # rank 0's displays, below the panel

    def render(self, payload: dict, fallback: dict) -> dict:
        """The bundle: ``payload`` for the extension, ``fallback``'s lines in text/html and text/plain."""
        return {MIME_TYPE: payload, "text/html": render_html(fallback, self._prefix_template),
                "text/plain": render_text(fallback, self._prefix_template)}

    def bundle(self, limit: int = SAVED_BYTES) -> dict:
        """The MIME bundle of the state as it is, within ``limit`` bytes as saved."""
        return bounded_bundle({**self.state.to_json(), "seq": self.tracker.seq}, self.render, limit)

    shows_runs = True  # (protocol.py) a run of lines comes whole: folded in at once (RunState.observe)

    def show(self, event: Event) -> None:
        self.state.observe(event)
        if event.kind == DISPLAY:
            if self._handle is None:
                self.publish()  # the panel first, the rank's outputs below it
            self.rich.show(event)
        self.tick()

    def note(self, text: str) -> None:
        self.state.note(text)
        self.tick()

    def retarget(self, node_rank: int, ranks) -> None:
        """The rendezvous gave this node its rank (c10d): the columns are its ranks."""
        self.state.set_ranks(ranks)

    def channel(self) -> PanelChannel | None:
        if self._find_channel:
            self._find_channel = False
            self._channel = panel_channel() if in_jupyter_kernel() else None
        if self._channel is not None:
            self._channel.begin(self.state.header["run_id"])
        return self._channel

    def tick(self) -> None:
        """Deltas to listening panels, else the MIME output, if something changed and the last update is old
        enough, or if the clock should move."""
        now = time.monotonic()
        if now - self._ticked_at < TICK_EVERY_S:
            return
        self._ticked_at = now
        channel = self.channel()
        live, joining = channel.listeners(self.state.header["run_id"]) if channel else ([], [])
        if live or joining:
            self._tick_live(now, live, joining)
            return
        since = now - self._published_at
        changed = self.state.changes != self._published_changes
        if (changed and since >= self._interval) or since >= FALLBACK_IDLE_S:
            self.publish(limit=FALLBACK_LIVE_BYTES)

    def _tick_live(self, now: float, live: list, joining: list) -> None:
        changed = self.state.changes != self._delta_changes
        refresh = (self._handle is not None and now - self._published_at >= REFRESH_S
                   and self.state.changes != self._published_changes)
        since = now - self._delta_at
        sent = True
        rate = FEW_RANKS_DELTAS_PER_S if len(self.state.ranks) <= 8 else DELTAS_PER_S
        if live and (refresh or joining or (changed and since >= 1.0 / rate) or since >= IDLE_UPDATE_S):
            self._send(live, self.tracker.delta())  # (joining: the full state they get is the one after it)
            self.deltas += 1
        elif not live:
            self.tracker.reset()
        else:
            sent = False
        if sent:
            self._delta_changes, self._delta_at = self.state.changes, now
        if joining:
            self._send(joining, self._full_message())
        if refresh:
            self.publish(limit=LIVE_BYTES)

    def _full_message(self, ended: bool = False, bundle: dict | None = None) -> dict:
        """The state for a panel that joins: while the run goes on, all of it (every line the state keeps, so a
        reload shows what the panel showed); at the end, the saved output's (``bundle``)."""
        state = bundle[MIME_TYPE] if bundle is not None else {**self.state.to_json(), "seq": self.tracker.seq}
        return {"type": "full", "run_id": self.state.header["run_id"], "seq": self.tracker.seq,
                "caps": self.tracker.caps, "ended": ended, "state": state}

    def _send(self, comms: list, message: dict) -> None:
        for comm in comms:
            try:
                send(comm, message)
            except Exception:  # noqa: BLE001 - a comm closed under us: the MIME output still says everything
                pass

    def publish(self, final: bool = False, limit: int = SAVED_BYTES) -> None:
        from IPython.core.interactiveshell import InteractiveShell
        from IPython.display import display

        if not InteractiveShell.initialized():  # display="panel" outside IPython: the end state, as text
            if final:
                self.last_bundle = wire_safe(self.bundle(limit))
                print(self.last_bundle["text/plain"], flush=True)
            return
        bundle = self.bundle(limit)
        state = json.dumps(bundle[MIME_TYPE], ensure_ascii=False)
        if any(_SURROGATE.search(text) for text in (state, bundle["text/html"], bundle["text/plain"])):
            bundle = wire_safe(bundle)  # (the last line of defence: the ranks' writer and the reader escape them)
        size = len(state) + len(bundle["text/html"]) + len(bundle["text/plain"])
        self._interval = max(1.0 / MAX_UPDATES_PER_S, size / MAX_BYTES_PER_S)
        if self._handle is None:
            self._handle = display(bundle, raw=True, display_id=True)
        else:
            self._handle.update(bundle, raw=True)
        self._published_changes = self.state.changes
        self._published_at = time.monotonic()
        self.updates += 1
        self.last_bundle = bundle

    def finish(self, status: str, **details) -> dict:
        """The run ended: the last delta to listening panels, then its final MIME output (what the saved
        notebook keeps); returns that output's state."""
        said = self.rich.finish()
        if said:
            self.state.note(said)
        self.state.finish(status, **details)
        channel = self.channel()
        run_id = self.state.header["run_id"]
        live: list = []
        if channel is not None:
            live, joining = channel.listeners(run_id)
            if live:
                self._send(live, self.tracker.delta())
                self.deltas += 1
            elif joining:
                self.tracker.reset()
        self.publish(final=True)
        if channel is not None:
            final = self._full_message(ended=True, bundle=self.last_bundle)
            comms = channel.end(run_id, final)
            self._send([comm for comm in comms if comm not in live], final)  # (joined until now: the end state)
            for comm in comms:
                try:
                    comm.close()
                except Exception:  # noqa: BLE001 - closing a comm that is already gone
                    pass
        return self.last_bundle[MIME_TYPE]
