"""The kernel's end of the comms that let a JupyterLab panel follow a live run (target ``TARGET``).

Each run has a comm of its own that the kernel holds without announcing it (no ``comm_open``), with the id
``run_comm_id(run_id)``, which the panel knows from the run's output. The panel makes its end of it in the page
and sends ``{"want": "full"}`` on it: once when it starts to follow the run, and whenever it missed a delta. It
never opens a comm and never uses a subshell, so the kernel publishes no ``busy``/``idle`` status for the panel
while the cell runs (JupyterLab would take a subshell's ``idle`` for the kernel's, jupyterlab#10701). ipykernel
(7.4, as tested) asks the comm, on its shell channel's thread, where to route a message on it
(``_reply_subshell_for``): the request is filed here right there, and the message goes on to the main shell,
which handles it once the cell is over (by then the run has ended: the final state is the answer). The
launching cell's thread (``PanelDisplay.tick``) sends the full state to a comm that asked, then deltas; the
kernel's sends go over IOPub and carry no status. Under ipykernel 6 (no such hook, no subshells) the request
waits for the cell's end; the panel then shows the MIME output, updated a few times a second as for a frontend
without the extension.

A comm the panel opens itself (``on_open``, the earlier protocol, kept for older extensions) is filed the same
way: it gets the full state once, then deltas. A comm for a run that already ended gets its final state and is
closed; one for a run this kernel does not know is closed. Messages are in labextension/SCHEMA.md.

``{"want": "stop"}`` on a run's comm asks the kernel to stop the run, where whoever shows it gave a way
(``stoppable``: a detached run, whose panel the Runs sidebar offers to stop). It is acted on where it is filed, on
the shell channel's thread, so it works while another cell runs; a foreground run has no such way (an interrupt of
the kernel stops it) and the request is ignored.

A message goes as compact UTF-8 JSON in one binary buffer of the comm message (``send``), with
``{"type", "packed": "json"}`` as its data: Jupyter's own JSON would add a space after every comma and colon
(a tenth of a delta) and escape the text a second time.
"""

from __future__ import annotations

import json
import threading
from collections import OrderedDict

from ..schema.wiretext import wire_safe

TARGET = "notebook_launcher.panel"
KEEP_ENDED = 20  # ended runs whose final state a late panel (a reload after the end) can still get


def run_comm_id(run_id: str) -> str:
    """The id of a run's own comm (the panel makes its end of it from the run id of the output)."""
    return f"{TARGET}.{run_id}"


def send(comm, message: dict) -> None:
    """``message`` to the panel at the other end of ``comm``, packed (see the module's docstring)."""
    try:
        packed = json.dumps(message, ensure_ascii=False, separators=(",", ":"), allow_nan=False)
    except (TypeError, ValueError):  # a NaN, an infinity, a value JSON does not know:
        comm.send(wire_safe(message))  # as Jupyter sends any message, cleaning them
        return
    # (a lone surrogate, which no UTF-8 carries, goes as its JSON escape: the last line of defence, see wire_text)
    comm.send({"type": message.get("type"), "packed": "json"}, buffers=[packed.encode("utf-8", "backslashreplace")])


def unpack(data: dict, buffers: list) -> dict:
    """The message a panel receives (what ``send`` packed); for tests and other clients."""
    if isinstance(data, dict) and data.get("packed") == "json" and buffers:
        return json.loads(bytes(buffers[0]).decode("utf-8", "surrogatepass"))
    return data


class PanelChannel:
    """The comms of every run of this kernel; thread-safe (comms open on a subshell's thread)."""

    def __init__(self, manager=None):
        self._manager = manager  # the kernel's comm manager, where the runs' own comms are registered
        self._lock = threading.Lock()
        self._live: dict[str, list] = {}  # run id -> comms that got the full state
        self._joining: dict[str, list] = {}  # run id -> comms waiting for it
        self._ended: OrderedDict[str, dict] = OrderedDict()  # run id -> its last "full" message
        self._held: dict[str, object] = {}  # run id -> its own comm (closed at its end)
        self._held_ended: OrderedDict[str, object] = OrderedDict()  # ... and after it, KEEP_ENDED of them
        self._stops: dict[str, object] = {}  # run id -> how to stop it (a detached run), until asked once or its end

    # -- from the frontend (any thread) --------------------------------------------------------------------------
    def on_open(self, comm, msg) -> None:
        data = (msg.get("content") or {}).get("data") or {}
        run_id = str(data.get("run_id", ""))
        comm.on_msg(lambda message: self._on_msg(run_id, comm, message))
        comm.on_close(lambda message: self._forget(run_id, comm))
        with self._lock:
            ended = self._ended.get(run_id)
            if ended is None and run_id in self._live:
                self._joining[run_id].append(comm)
                return
        if ended is not None:
            send(comm, ended)
        else:
            send(comm, {"type": "unknown", "run_id": run_id})
        comm.close()

    def _on_msg(self, run_id: str, comm, msg) -> None:
        """``{"want": "full"}``: a panel that missed a delta asks for the whole state again."""
        data = (msg.get("content") or {}).get("data") or {}
        self.request(run_id, comm, data)

    def request(self, run_id: str, comm, data) -> None:
        """A panel's request on ``comm`` (any thread): ``{"want": "full"}`` files the comm for the full state,
        while the run goes on; ``{"want": "stop"}`` stops a run that can be stopped from here."""
        if isinstance(data, dict) and data.get("want") == "stop":
            with self._lock:
                stop = self._stops.pop(run_id, None)  # (ipykernel 7 passes a message here twice: once is enough)
            if stop is not None:
                stop()
            return
        if not isinstance(data, dict) or data.get("want") != "full":
            return
        with self._lock:
            if run_id not in self._live:
                return
            if comm in self._live[run_id]:
                self._live[run_id].remove(comm)
            if comm not in self._joining[run_id]:
                self._joining[run_id].append(comm)

    def _forget(self, run_id: str, comm) -> None:
        with self._lock:
            for table in (self._live, self._joining):
                if comm in table.get(run_id, []):
                    table[run_id].remove(comm)

    # -- from the launching cell's thread ------------------------------------------------------------------------
    def begin(self, run_id: str) -> None:
        with self._lock:
            if run_id in self._live:
                return
            self._live[run_id] = []
            self._joining[run_id] = []
        if self._manager is not None:
            self._hold_comm(run_id)

    def stoppable(self, run_id: str, stop) -> None:
        """``stop()`` (quick, any thread) ends the run when a panel asks (``{"want": "stop"}``), until its end."""
        with self._lock:
            if run_id in self._live:
                self._stops[run_id] = stop

    def _hold_comm(self, run_id: str) -> None:
        """The run's own comm, registered with the kernel and never announced (see the module's docstring)."""
        try:
            from comm import create_comm

            comm = create_comm(target_name=TARGET, comm_id=run_comm_id(run_id), primary=False)

            def route(data, default=None):  # ipykernel asks it on its shell channel's thread
                try:
                    self.request(run_id, comm, data)
                except Exception:  # noqa: BLE001 - never let ipykernel's router fail on us
                    pass
                return None  # the main shell: it handles the message after the cell, with no status before

            comm._reply_subshell_for = route
            comm.on_msg(lambda message: self._on_msg(run_id, comm, message))  # (ipykernel without the hook)
            close = comm.close  # closed at the run's end, kept registered a while: a late request finds it
            comm.close = lambda *args, **kwargs: close(deleting=True)
            self._manager.register_comm(comm)
            with self._lock:
                self._held[run_id] = comm
        except Exception:  # noqa: BLE001 - no comms here (plain IPython): panels opened by the page still work
            return

    def listeners(self, run_id: str) -> tuple[list, list]:
        """(comms following the run, comms waiting for the full state); the waiting ones count as following
        from now on, so send them the full state now."""
        with self._lock:
            live, joining = list(self._live.get(run_id, [])), self._joining.get(run_id, [])
            self._joining[run_id] = []
            self._live.setdefault(run_id, []).extend(joining)
            return live, list(joining)

    def end(self, run_id: str, final: dict) -> list:
        """The run ended: ``final`` is what later panels get; returns the comms to send it to and close."""
        with self._lock:
            comms = self._live.pop(run_id, []) + self._joining.pop(run_id, [])
            held = self._held.pop(run_id, None)
            self._stops.pop(run_id, None)
            if held is not None:
                if held not in comms:
                    comms.append(held)  # (closed though no panel asked, so the pages know)
                self._held_ended[run_id] = held
            self._ended[run_id] = final
            while len(self._ended) > KEEP_ENDED:
                self._ended.popitem(last=False)
            while len(self._held_ended) > KEEP_ENDED:
                _, old = self._held_ended.popitem(last=False)
                try:
                    self._manager.unregister_comm(old)
                except Exception:  # noqa: BLE001 - gone already
                    pass
            return comms


_channel: PanelChannel | None = None
_channel_lock = threading.Lock()


def panel_channel() -> PanelChannel | None:
    """This kernel's channel, its comm target registered on first use (call it in a Jupyter kernel only); None
    where comms cannot be had."""
    global _channel
    with _channel_lock:
        if _channel is None:
            try:
                from comm import get_comm_manager

                manager = get_comm_manager()
                channel = PanelChannel(manager)
                manager.register_target(TARGET, channel.on_open)
            except Exception:  # noqa: BLE001 - an old ipykernel without the comm package: the MIME output alone, as before
                return None
            _channel = channel
    return _channel
