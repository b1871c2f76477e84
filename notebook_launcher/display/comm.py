"""The kernel's end of the comms the JupyterLab extension opens to follow a live panel (target ``TARGET``).

A panel in JupyterLab opens one comm per run it shows live, with ``{"run_id": ...}``. JupyterLab sends comm
messages over a kernel subshell (ipykernel 7), so the comm opens while the launching cell still runs; the handler
runs on the subshell's thread and only files the comm here: the launching cell's thread (``PanelDisplay.tick``)
sends it the full state once, then deltas. A comm for a run that already ended gets its final state and is
closed; one for a run this kernel does not know is closed. Messages are in labextension/SCHEMA.md.

A message goes as compact UTF-8 JSON in one binary buffer of the comm message (``send``), with
``{"type", "packed": "json"}`` as its data: Jupyter's own JSON would add a space after every comma and colon
(a tenth of a delta) and escape the text a second time.
"""

from __future__ import annotations

import json
import threading
from collections import OrderedDict

TARGET = "notebook_launcher.panel"
KEEP_ENDED = 20  # ended runs whose final state a late panel (a reload after the end) can still get


def send(comm, message: dict) -> None:
    """``message`` to the panel at the other end of ``comm``, packed (see the module's docstring)."""
    try:
        packed = json.dumps(message, ensure_ascii=False, separators=(",", ":"), allow_nan=False)
    except (TypeError, ValueError):  # a NaN, an infinity, a value JSON does not know:
        comm.send(message)  # as Jupyter sends any message, cleaning them
        return
    comm.send({"type": message.get("type"), "packed": "json"}, buffers=[packed.encode("utf-8", "surrogatepass")])


def unpack(data: dict, buffers: list) -> dict:
    """The message a panel receives (what ``send`` packed); for tests and other clients."""
    if isinstance(data, dict) and data.get("packed") == "json" and buffers:
        return json.loads(bytes(buffers[0]).decode("utf-8", "surrogatepass"))
    return data


class PanelChannel:
    """The comms of every run of this kernel; thread-safe (comms open on a subshell's thread)."""

    def __init__(self):
        self._lock = threading.Lock()
        self._live: dict[str, list] = {}  # run id -> comms that got the full state
        self._joining: dict[str, list] = {}  # run id -> comms waiting for it
        self._ended: OrderedDict[str, dict] = OrderedDict()  # run id -> its last "full" message

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
        if data.get("want") == "full":
            with self._lock:
                if comm in self._live.get(run_id, []):
                    self._live[run_id].remove(comm)
                    self._joining[run_id].append(comm)

    def _forget(self, run_id: str, comm) -> None:
        with self._lock:
            for table in (self._live, self._joining):
                if comm in table.get(run_id, []):
                    table[run_id].remove(comm)

    # -- from the launching cell's thread ------------------------------------------------------------------------
    def begin(self, run_id: str) -> None:
        with self._lock:
            self._live.setdefault(run_id, [])
            self._joining.setdefault(run_id, [])

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
            self._ended[run_id] = final
            while len(self._ended) > KEEP_ENDED:
                self._ended.popitem(last=False)
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
                channel = PanelChannel()
                manager.register_target(TARGET, channel.on_open)
            except Exception:  # noqa: BLE001 - an old ipykernel without the comm package: the MIME output alone, as before
                return None
            _channel = channel
    return _channel
