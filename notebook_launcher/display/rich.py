"""Rank 0's displays as outputs of the launching cell, below the run panel; every rank's as a line of its column.

A rank's ``display()``, matplotlib figure, ``update_display`` and ``clear_output`` arrive as ``display`` events
(``rank/rich_output.py``). Where they go:

- **rank 0**: each display is an output of the launching cell, live, saved with the notebook; an update of a
  display id replaces that output in place (Transformers' progress table is one output, updated); its
  ``text/plain`` starts with ``[rank 0] `` so a text-only frontend or export reads ``[rank 0] <Figure size
  640x480 with 1 Axes>``. ``clear_output()`` clears rank 0's outputs only, never the panel: the cleared outputs
  are blanked and reused by the next displays (``clear_output(wait=True)`` then ``display(fig)`` in a loop is
  one output, redrawn).
- **every rank** (rank 0 too): a line ``[display] <its text>`` in its column of the panel, in order with its
  prints (``state.py``); the whole bundle is in the run log (events.jsonl, kind ``display``).

Caps per run: at most ``MAX_OUTPUTS`` outputs in the cell and ``MAX_CELL_BYTES`` of them at a time (what the saved
notebook grows by: each output's bundle, every MIME type of it, and its metadata, as nbformat writes them); what
goes over is not shown, and ``finish`` returns one line saying how much (the panel's notes show it).
"""

from __future__ import annotations

from ..schema.events import DISPLAY, Event
from .budget import saved_size

MAX_OUTPUTS = 100
MAX_CELL_BYTES = 20 * 2**20
BLANK = {"text/plain": ""}
SHOWN_RANK = 0


class RankOutputs:
    """Rank 0's ``display`` events as the cell's outputs (IPython's ``display``, by display id)."""

    def __init__(self, prefix: str = "[rank 0] ", publish=None):
        self._prefix = prefix
        self._publish = publish  # (bundle, metadata, handle or None) -> handle; None: IPython's display
        self._slots: list[dict] = []  # {"handle", "bytes"}, in the cell's order
        self._free: list[int] = []  # slots cleared, for the next displays
        self._ids: dict[str, int] = {}  # the rank's display id -> its slot
        self._clear_pending = False
        self.held_bytes = 0
        self.left_out = 0
        self.left_out_bytes = 0
        self.elsewhere: dict[int, int] = {}  # other ranks -> how many displays they made

    def show(self, event: Event) -> None:
        if event.kind != DISPLAY:
            return
        data = event.data
        if event.rank != SHOWN_RANK:
            if data.get("op") == "display":
                self.elsewhere[event.rank] = self.elsewhere.get(event.rank, 0) + 1
            return
        op = data.get("op")
        if op == "clear":
            self._clear_pending = True
            if not data.get("wait"):
                self._clear()
            return
        bundle, metadata = self._bundle(data)
        if bundle is None:
            return
        display_id = data.get("display_id") if isinstance(data.get("display_id"), str) else None
        size = saved_size(bundle, metadata)
        if op == "update":
            slot = self._ids.get(display_id) if display_id is not None else None
            if slot is not None:
                self._put(slot, bundle, metadata, size)
            return
        if self._clear_pending:
            self._clear(keep_first=True)  # (the display that follows a clear(wait=True) takes the first output)
        slot = self._free.pop(0) if self._free else None
        if slot is None and len(self._slots) >= MAX_OUTPUTS:
            self._leave_out(size)
            return
        if slot is None:
            if self.held_bytes + size > MAX_CELL_BYTES:
                self._leave_out(size)
                return
            slot = len(self._slots)
            self._slots.append({"handle": None, "bytes": 0})
        if display_id is not None:
            self._ids[display_id] = slot
        self._put(slot, bundle, metadata, size)

    def finish(self) -> str:
        """One line about rank 0's displays the caps left out and the other ranks' displays, or ""."""
        parts = []
        if self.left_out:
            parts.append(f"rank 0: {self.left_out} display(s) ({self.left_out_bytes / 2**20:.1f} MB) not shown "
                         f"in the cell, over its caps of {MAX_OUTPUTS} outputs and {MAX_CELL_BYTES // 2**20} MB a "
                         f"run (the run log has them, kind \"display\")")
        if self.elsewhere:
            ranks = ", ".join(f"rank {rank}: {count}" for rank, count in sorted(self.elsewhere.items()))
            parts.append(f"displays of other ranks ({ranks}) are lines \"[display] ...\" in their columns; the run "
                         f"log has them whole (kind \"display\")")
        return "; ".join(parts)

    # -- the cell's outputs --------------------------------------------------------------------------------------
    def _bundle(self, data: dict):
        bundle = data.get("data")
        if not isinstance(bundle, dict):
            return None, None
        bundle = {mime: value for mime, value in bundle.items()
                  if isinstance(mime, str) and isinstance(value, (str, dict, list))}
        text = bundle.get("text/plain")
        bundle["text/plain"] = self._prefix + (text if isinstance(text, str) else f"<{', '.join(bundle)}>")
        metadata = data.get("metadata") if isinstance(data.get("metadata"), dict) else {}
        return bundle, {key: value for key, value in metadata.items() if key in bundle}

    def _put(self, slot: int, bundle: dict, metadata: dict, size: int) -> None:
        held = self._slots[slot]
        if self.held_bytes - held["bytes"] + size > MAX_CELL_BYTES:
            self._leave_out(size)
            return
        try:
            held["handle"] = self._send(bundle, metadata, held["handle"])
        except Exception:  # noqa: BLE001 - no frontend to show it (a closed kernel, plain Python): the run log has it
            return
        self.held_bytes += size - held["bytes"]
        held["bytes"] = size

    def _clear(self, keep_first: bool = False) -> None:
        """Rank 0's outputs blanked (never the panel's), free for the next displays."""
        self._clear_pending = False
        self._ids.clear()
        for slot, held in enumerate(self._slots):
            if held["bytes"] and held["handle"] is not None and not (keep_first and slot == 0):
                self._put(slot, dict(BLANK), {}, 0)
        self._free = list(range(len(self._slots)))

    def _leave_out(self, size: int) -> None:
        self.left_out += 1
        self.left_out_bytes += size

    def _send(self, bundle: dict, metadata: dict, handle):
        if self._publish is not None:
            return self._publish(bundle, metadata, handle)
        from IPython.core.interactiveshell import InteractiveShell
        from IPython.display import display

        if not InteractiveShell.initialized():
            return handle
        if handle is None:
            return display(bundle, raw=True, metadata=metadata, display_id=True)
        handle.update(bundle, raw=True, metadata=metadata)
        return handle
