"""A panel's ``{"want": "stop"}`` on a run's comm (the Runs sidebar's stop button): the run is stopped once where
whoever shows it gave a way (a detached run), and never otherwise (a foreground run, a run that has ended). The
whole path, a real JupyterLab, kernel and detached run, is in test_browser_detached.py."""

from __future__ import annotations

from notebook_launcher.display.comm import PanelChannel
from notebook_launcher.display.state import RunState


def _state(run_id: str, detached: bool) -> RunState:
    return RunState(run_id, f"/tmp/{run_id}", "cpu", "gloo", "fork", 2, 2, [0, 1], detached=detached)


def test_a_stop_request_stops_a_detached_run_once_and_nothing_else():
    channel, stops = PanelChannel(), []
    comm = object()  # (a request names its comm; stopping does not use it)
    for run_id in ("detached-run", "foreground-run"):
        channel.begin(run_id)
    channel.stoppable("detached-run", lambda: stops.append("detached-run"))
    assert _state("detached-run", True).to_json()["detached"] is True  # what tells the extension it may ask
    assert _state("foreground-run", False).to_json()["detached"] is False

    channel.request("foreground-run", comm, {"want": "stop"})  # an interrupt of the kernel stops that one
    channel.request("detached-run", comm, {"want": "full"})
    assert stops == []
    channel.request("detached-run", comm, {"want": "stop"})
    channel.request("detached-run", comm, {"want": "stop"})  # (ipykernel 7 hands one message over twice)
    assert stops == ["detached-run"]

    channel.begin("ended-run")
    channel.stoppable("ended-run", lambda: stops.append("ended-run"))
    channel.end("ended-run", {"type": "full", "ended": True})
    channel.request("ended-run", comm, {"want": "stop"})  # a late click, after the end: nothing to stop
    channel.stoppable("unknown-run", lambda: stops.append("unknown-run"))  # not shown here: not kept
    channel.request("unknown-run", comm, {"want": "stop"})
    assert stops == ["detached-run"]
