"""What the launcher needs of a display: four methods, so a new way to show a run is one small class.

The launcher feeds a display from the launching cell's thread: every event in order (``show``), its own lines
(``note``), a call every few hundred milliseconds while waiting (``tick``, for displays that redraw), and,
after a c10d rendezvous, which ranks this node got (``retarget``). A display whose class says
``shows_runs = True`` gets a run of one rank's lines read together (``lines.StreamLines``, ``lines.LogRecords``)
through ``show`` whole, as one event; any other gets each of their lines as an Event (``shown_whole``).
``TextDisplay`` and ``PanelDisplay`` are displays; so is the agent's ``ForwardingDisplay``, which sends
everything to the launching kernel instead.

``notebook_launcher(display=...)`` takes "auto", "panel", "text" or any object ``is_display`` accepts.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any, Protocol, runtime_checkable

from ..schema.events import Event
from ..schema.lines import RUNS


@runtime_checkable
class Display(Protocol):
    """Shows one run while it goes on."""

    def show(self, event: Event) -> None:
        """One event of a rank (or of the launcher), in the order the ranks' events are released."""

    def note(self, text: str) -> None:
        """A line of the launcher itself: the plan, a restart, a warning."""

    def tick(self) -> None:
        """Called every few hundred milliseconds while the launcher waits: redraw if something is due."""

    def retarget(self, node_rank: int, ranks: Iterable[int]) -> None:
        """The rendezvous gave this node its rank: its processes are these global ranks."""


@runtime_checkable
class FinishingDisplay(Display, Protocol):
    """A display with an end state to show and keep: the panel (the launcher calls ``finish`` on the panel it
    made; displays passed in by a caller are not asked to)."""

    def finish(self, status: str, **details: Any) -> dict:
        """The run ended with ``status`` (``failure``, ``result_type``, ``stuck_ranks``): show the final state
        and return it (the run keeps it as ``panel_state``)."""


def is_display(obj: Any) -> bool:
    """True if ``obj`` has what the launcher calls on a display (``show``, ``note``, ``tick``, ``retarget``): an
    instance (a display's class has them too, as functions that want an instance)."""
    return not isinstance(obj, (str, type)) and isinstance(obj, Display)


def shown_whole(display: Display) -> Callable[[Any], None]:
    """What to pass every event of a run to, for ``display``: its ``show``, which takes a run of lines whole
    where the display says so (``shows_runs``); else a ``show`` that gives it each line of a run as an Event."""
    show = display.show
    if getattr(display, "shows_runs", False):
        return show

    def each_line(event) -> None:
        if type(event) in RUNS:
            for line in event.events():
                show(line)
        else:
            show(event)
    return each_line
