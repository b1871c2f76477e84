"""A detached run's live panel in a notebook: the panel a foreground run shows (``display/panel.py``), fed from a
connection of its own to the run's socket (the full state first, then what follows) by a thread of this kernel,
so it keeps updating after the cell that showed it has ended. A run that has ended is drawn from its run log and
outcome."""

from __future__ import annotations

from .detached_channel import Follower, as_event, connect
from .display.panel import PanelDisplay
from .display.replay import read_events
from .display.state import RunState


def new_panel(run) -> PanelDisplay:
    """The run's panel, shown now in the cell that asks (its display id is what a thread updates later)."""
    described = run.described
    state = RunState(run.run_id, run.run_dir, described["device"], described["backend"], described["start_method"],
                     described["num_processes"], described["world_size"], list(described["ranks"]))
    panel = PanelDisplay(state, described["prefix"])
    panel.publish()
    return panel


def feed(panel: PanelDisplay, header: dict, attachment: bytes) -> None:
    """One message of the run's channel into the panel."""
    if "event" in header:
        panel.show(as_event(header, attachment))
    elif "note" in header:
        panel.note(header["note"])
    elif "end" in header:
        outcome = header["end"]
        status = outcome.get("status", "failed")
        panel.finish(status, failure=outcome.get("panel_failure"), stuck_ranks=outcome.get("stuck_ranks", ()),
                     result_type=outcome.get("result_type") if status == "finished" else None)


def show_panel(run) -> PanelDisplay:
    """Show the run's panel here, from a connection of its own (the full state, then what follows); a run that
    has ended, from its run log and outcome."""
    connection = None if run.done else connect(run.run_dir)
    panel = new_panel(run)
    if connection is None:
        for event in read_events(run.run_dir):
            panel.state.observe(event)
        feed(panel, {"end": run.outcome}, b"")
        return panel
    Follower(connection, lambda header, attachment: feed(panel, header, attachment), lambda: None)
    return panel
