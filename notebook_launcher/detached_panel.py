"""A detached run's live panel in a notebook: the panel a foreground run shows (``display/panel.py``), fed from a
connection of its own to the run's socket (the full state first, then what follows) by a thread of this kernel,
so it keeps updating after the cell that showed it has ended. A run that has ended is drawn from its run log and
outcome."""

from __future__ import annotations

from .detached_channel import Follower, as_event, connect
from .display.panel import PanelDisplay
from .display.replay import read_events
from .display.state import RunState
from .schema.detached_files import LOST
from .schema.status import RunStatus


def new_panel(run) -> PanelDisplay:
    """The run's panel, shown now in the cell that asks (its display id is what a thread updates later). Its
    state says the run is detached, and its comm, held before the output reaches the page, takes a panel's
    ``{"want": "stop"}`` (the Runs sidebar's stop button) as ``run.stop()``, without waiting for the end."""
    described = run.described
    state = RunState(run.run_id, run.run_dir, described["device"], described["backend"], described["start_method"],
                     described["num_processes"], described["world_size"], list(described["ranks"]), detached=True,
                     began_before=True)
    panel = PanelDisplay(state, described["prefix"])
    channel = panel.channel()
    if channel is not None:
        channel.stoppable(run.run_id, lambda: run.stop(timeout=0))
    panel.publish()
    return panel


def ticker(panel: PanelDisplay):
    """The panel's ``tick`` while the run goes on, for its connection's quiet moments (``Follower``'s
    ``on_idle``): a page that asked gets the state, the output's clock moves. Never after the end, whose output
    stays as the end made it."""
    def tick() -> None:
        if panel.state.status in (RunStatus.STARTING, RunStatus.RUNNING):
            panel.tick()
    return tick


def feed(panel: PanelDisplay, header: dict, attachment: bytes) -> None:
    """One message of the run's channel into the panel."""
    if "event" in header:
        panel.show(as_event(header, attachment))
    elif "note" in header:
        panel.note(header["note"])
    elif "end" in header:
        outcome = header["end"]
        status, failure = outcome.get("status", "failed"), outcome.get("panel_failure")
        if status == LOST:  # (the panel's statuses are a run's: a lost run failed, and its card says how)
            status, failure = "failed", {"kind": "failure", "rank": None, "type": "DetachedRunError", "traceback": "",
                                         "message": outcome.get("error", {}).get("message", "lost"), "stacks": {}}
        panel.finish(status, failure=failure, stuck_ranks=outcome.get("stuck_ranks", ()),
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
    ended = []

    def on_message(header: dict, attachment: bytes) -> None:
        ended.extend(["end"] if "end" in header else [])
        feed(panel, header, attachment)

    def on_end() -> None:
        if not ended and run.wait_ended():  # the connection closed without the run's end: its handle says how
            feed(panel, {"end": run.outcome}, b"")

    Follower(connection, on_message, on_end, on_idle=ticker(panel))
    return panel
