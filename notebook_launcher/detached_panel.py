"""A detached run's live panel in a notebook: the panel a foreground run shows (``display/panel.py``), fed from a
connection of its own to the run's socket (the full state first, then what follows) by a thread of this kernel,
so it keeps updating after the cell that showed it has ended. A run that has ended is drawn from its run log and
outcome."""

from __future__ import annotations

from .detached_channel import Follower, as_event, connect
from .display.panel import PanelDisplay
from .display.replay import read_events
from .display.state import RunState


def _panel(run) -> PanelDisplay:
    described = run.described
    state = RunState(run.run_id, run.run_dir, described["device"], described["backend"], described["start_method"],
                     described["num_processes"], described["world_size"], list(described["ranks"]))
    return PanelDisplay(state, described["prefix"])


def _finish(panel: PanelDisplay, outcome: dict) -> None:
    status = outcome.get("status", "failed")
    panel.finish(status, failure=outcome.get("panel_failure"), stuck_ranks=outcome.get("stuck_ranks", ()),
                 result_type=outcome.get("result_type") if status == "finished" else None)


def show_panel(run) -> PanelDisplay:
    """Show the run's panel here; while the run goes on, it follows it."""
    panel = _panel(run)
    connection = None if run.done else connect(run.run_dir)
    if connection is None:
        for event in read_events(run.run_dir):
            panel.state.observe(event)
        run.wait_started(0)
        _finish(panel, run._outcome or {"status": run.status})
        return panel
    panel.publish()  # the output now, in the cell that asked; the thread updates it by its display id

    def on_message(header: dict, attachment: bytes) -> None:
        if "event" in header:
            panel.show(as_event(header, attachment))
        elif "note" in header:
            panel.note(header["note"])
        elif "end" in header:
            _finish(panel, header["end"])

    Follower(connection, on_message, lambda: None)
    return panel
