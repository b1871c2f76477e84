"""What IPython would publish from a rank (``display()``, matplotlib's inline figures, ``update_display``,
``clear_output``) goes to the kernel as ``display`` events, not through the kernel's connection.

Worker side only (it knows the event schema, nothing of the kernel). A forked rank inherits the kernel's
IPython shell, whose display publisher and display hook would send on the kernel's sockets: ipykernel refuses
that from a fork ("attempted to send message from fork", in the server's log) and the output is lost. Here the
shell's publisher and hook are replaced by ones that send each bundle on the rank's event pipe; the kernel shows
rank 0's in the cell (``display/rich.py``). A spawned rank of a launch from a kernel (``ENV_VAR``) gets a small
shell of its own with the same publisher, so ``display()`` and ``%matplotlib inline`` figures work there too.

Bounded in the rank: a bundle over ``MAX_BUNDLE_BYTES``, or one the kernel's reader would refuse (JSON nested
deeper than ``decoding.MAX_NESTING``, an int beyond 64 bits) keeps only its text; past ``MAX_RANK_BYTES`` in a run
(or ``MAX_RANK_DISPLAYS`` bundles) bundles go as text only, then not at all, and one line on stderr says how
many were left out. Updates of one display id go at most every ``UPDATE_EVERY_S`` (the newest one wins; the
last goes at the rank's end). Widgets cannot live in a rank (their state needs the kernel): ``tqdm.auto`` and
``tqdm.notebook`` draw tqdm's console bar there (the panel makes it the rank's progress), any other widget
gets one line saying so, and what IPython and ipywidgets call on the publisher, the display hook and the shell
(``set_parent``, ``topic``, ``showtraceback``) works: ``interact`` calls its function once, ``with Output():``
lets its output through, a failing ``_repr_html_`` prints its traceback on the rank's stderr and the display
goes as its text, as IPython does.
"""

from __future__ import annotations

import atexit
import base64
import json
import os
import re
import sys
import time

from ..schema.decoding import MAX_NESTING, data_within_bounds
from ..schema.events import DISPLAY
from . import context

ENV_VAR = "NOTEBOOK_LAUNCHER_RICH_OUTPUT"  # "1" in a spawned rank whose launch came from a Jupyter kernel
MAX_BUNDLE_BYTES = 4 * 2**20  # one display's bundle; a larger one keeps its text/plain only
MAX_RANK_BYTES = 64 * 2**20  # what one rank sends in displays in a run; then text only
MAX_RANK_DISPLAYS = 20_000  # display events one rank sends in a run; then none
MAX_TEXT = 4000  # characters of text/plain kept when the rest of a bundle is left out
UPDATE_EVERY_S = 0.1  # updates of one display id, at most this often (a progress table updated every step)
WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"
WIDGET_NOTE = ("notebook_launcher: an ipywidget ({name}) cannot live in a launched rank (its state needs the "
               "notebook's kernel); show values with print(), report(step=..., loss=...) or display() of a plot "
               "or table instead (tqdm bars become the rank's progress)")
BOUNDS_NOTE = ("notebook_launcher: a display's {mimes} nests lists and dicts deeper than {depth} or holds an int "
               "beyond 64 bits, which the notebook's side does not read: such a display goes as its text/plain")
MAX_OMITTED = 64  # MIME types an event names as left out (events.DATA_SCHEMA)
_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")

_sender: RankDisplays | None = None


def kernel_flag() -> str:
    """The kernel side's value of ``ENV_VAR`` for a spawned rank: "1" inside a Jupyter kernel, else ""."""
    shell = _kernel_shell()
    return "1" if shell is not None and getattr(shell, "kernel", None) is not None else ""


def install() -> None:
    """In a rank started from a Jupyter kernel: displays, figures and widgets go to the kernel through the rank's
    writer (``context.current``); elsewhere (torchrun, a terminal, a launch from plain Python) nothing changes."""
    global _sender
    shell = _kernel_shell()
    forked = shell is not None and getattr(shell, "kernel", None) is not None
    if not forked and os.environ.get(ENV_VAR) != "1":
        return
    if shell is None:
        shell = _own_shell()
        if shell is None:
            return
    _sender = RankDisplays(context.current.emit)
    _replace_publisher(shell, _sender)
    _quiet_widgets(_sender)
    _console_tqdm()
    atexit.register(_at_rank_end)


class RankDisplays:
    """The rank's displays as events, bounded and with updates of one display id thinned out."""

    def __init__(self, emit):
        self._emit = emit
        self.sent_bytes = 0
        self.sent = 0
        self.left_out = 0  # bundles not sent at all (over MAX_RANK_DISPLAYS)
        self.cut = 0  # bundles sent as text only (too large, or over MAX_RANK_BYTES)
        self._last_update: dict[str, float] = {}
        self._pending: dict[str, dict] = {}  # display id -> its newest update, not yet sent
        self.widget_noted = False
        self.bounds_noted = False

    def display(self, data: dict, metadata: dict | None, display_id: str | None, update: bool) -> None:
        payload = self._payload(data, metadata)
        payload.update(op="update" if update else "display", display_id=display_id)
        if update and display_id is not None:
            now = time.monotonic()
            if now - self._last_update.get(display_id, 0.0) < UPDATE_EVERY_S:
                self._pending[display_id] = payload
                return
            self._pending.pop(display_id, None)
            self._last_update[display_id] = now
        else:
            self.flush()
        self._send(payload)

    def clear(self, wait: bool) -> None:
        self.flush()
        self._send({"op": "clear", "wait": bool(wait)})

    def flush(self) -> None:
        """Every update held back, now (before a new display or a clear, and at the rank's end)."""
        pending, self._pending = self._pending, {}
        now = time.monotonic()
        for display_id, payload in pending.items():
            self._last_update[display_id] = now
            self._send(payload)

    def _send(self, payload: dict) -> None:
        if self.sent >= MAX_RANK_DISPLAYS:
            self.left_out += 1
            return
        self.sent += 1
        self.sent_bytes += payload.pop("_sent", 0)  # what goes out (measured once, by _payload)
        try:
            self._emit(DISPLAY, payload)
        except (TypeError, ValueError):  # a value marshal refuses, after all: its text alone
            self._emit(DISPLAY, {"op": payload["op"], "display_id": payload.get("display_id"),
                                 "data": {"text/plain": "<a display that could not be sent>"}, "omitted": []})

    def _payload(self, data: dict, metadata: dict | None) -> dict:
        """Jupyter's wire form of a bundle (bytes as base64, JSON values as plain JSON), within the bounds."""
        bundle = {}
        for mime, value in (data or {}).items():
            value = _wire(value)
            if value is not None:
                bundle[str(mime)] = value
        omitted = []
        if WIDGET_VIEW in bundle:
            del bundle[WIDGET_VIEW]
            omitted.append(WIDGET_VIEW)
            if not self.widget_noted:
                self.widget_noted = True
                print(WIDGET_NOTE.format(name="a widget's view"), file=sys.stderr)
        metadata = {key: value for key, value in (_wire(metadata) or {}).items() if key in bundle} \
            if isinstance(metadata, dict) else {}
        size = _wire_size(bundle) + _wire_size(metadata)  # what it would send: every MIME type and the metadata
        cut = False
        if size > MAX_BUNDLE_BYTES or self.sent_bytes + size > MAX_RANK_BYTES:
            text = str(bundle.get("text/plain", ""))
            omitted += [mime for mime in bundle if mime != "text/plain"]
            bundle, metadata = {"text/plain": text[:MAX_TEXT]}, {}
            self.cut, cut = self.cut + 1, True
        if not data_within_bounds({"data": bundle, "metadata": metadata}):  # (the kernel's reader would refuse it)
            beyond = [mime for mime in bundle if mime != "text/plain"]
            if not self.bounds_noted:
                self.bounds_noted = True
                print(BOUNDS_NOTE.format(mimes=", ".join(beyond) or "metadata", depth=MAX_NESTING), file=sys.stderr)
            omitted += beyond
            text = bundle.get("text/plain")
            bundle, metadata = {"text/plain": text[:MAX_TEXT] if isinstance(text, str) else ""}, {}
            self.cut, cut = self.cut + 1, True
        sent = _wire_size(bundle) if cut else size  # a cut one goes as its text alone
        return {"data": bundle, "metadata": metadata, "omitted": omitted[:MAX_OMITTED], "bytes": size, "_sent": sent}

    def summary(self) -> str:
        """One line about what the bounds left out, or ""."""
        if not self.left_out and not self.cut:
            return ""
        return (f"notebook_launcher: this rank's displays went over its bounds for the run: {self.cut} sent as "
                f"text only, {self.left_out} left out (at most {MAX_BUNDLE_BYTES // 2**20} MB a display, "
                f"{MAX_RANK_BYTES // 2**20} MB and {MAX_RANK_DISPLAYS} displays a rank)")


def _wire_size(values) -> int:
    """Bytes a bundle or its metadata takes on the wire (a str by its length, JSON data as JSON)."""
    if not values:
        return 0
    return sum(len(value) if isinstance(value, str) else len(json.dumps(value, default=str))
               for value in values.values())


def _wire(value):
    """A bundle's value as JSON carries it: bytes as base64, str as it is, JSON data made plain; None: unsendable."""
    if isinstance(value, (bytes, bytearray, memoryview)):
        return base64.b64encode(bytes(value)).decode("ascii")
    if isinstance(value, str):
        return value
    try:
        return json.loads(json.dumps(value, default=str))
    except (TypeError, ValueError, RecursionError):
        return None


def _kernel_shell():
    """The IPython shell of this process, if IPython is loaded and has one (a fork of a kernel inherits it)."""
    interactiveshell = sys.modules.get("IPython.core.interactiveshell")
    if interactiveshell is None or not interactiveshell.InteractiveShell.initialized():
        return None
    return interactiveshell.InteractiveShell.instance()


def _own_shell():
    """A spawned rank: a shell without history or a terminal, so display() and the inline backend have one."""
    try:
        from IPython.core.interactiveshell import InteractiveShell
        from traitlets.config import Config

        config = Config()
        config.HistoryManager.enabled = False
        return InteractiveShell.instance(config=config)
    except Exception:  # noqa: BLE001 - no IPython that works here: displays print their text, as in Python
        return None


def _replace_publisher(shell, sender: RankDisplays) -> None:
    from IPython.core.displayhook import DisplayHook
    from IPython.core.displaypub import DisplayPublisher

    class RankPublisher(DisplayPublisher):
        """The shell's display publisher in a rank: bundles become events. What ipykernel's publisher has besides
        (an Output widget and the shell's ``set_parent`` call them) is here too, doing nothing."""

        topic = None

        def publish(self, data, metadata=None, source=None, *, transient=None, update=False, **kwargs):
            display_id = (transient or {}).get("display_id")
            sender.display(data, metadata, None if display_id is None else str(display_id), bool(update))

        def clear_output(self, wait=False):
            sender.clear(wait)

        def register_hook(self, hook):  # (ipykernel's publisher has these; an Output widget calls them)
            pass

        def unregister_hook(self, hook):
            return True

        set_parent = _set_parent
        set_thread_parent = _set_parent
        reset_thread_parent = _set_parent

    class RankDisplayHook(DisplayHook):
        """A cell's last value (``%%accelerate``), as a display of its bundle, without an ``Out[n]`` prompt."""

        topic = None
        set_parent = _set_parent
        set_thread_parent = _set_parent
        reset_thread_parent = _set_parent

        def start_displayhook(self):
            pass

        def write_output_prompt(self):
            pass

        def write_format_data(self, format_dict, md_dict=None):
            sender.display(format_dict, md_dict, None, False)

        def finish_displayhook(self):
            pass

    shell.display_pub = RankPublisher(shell=shell)
    shell.displayhook = RankDisplayHook(shell=shell, cache_size=0)
    sys.displayhook = shell.displayhook
    shell._showtraceback = _traceback_to_stderr(shell)


def _set_parent(self, parent):
    """A message's parent header: a rank sends on no connection of the kernel's, so it has no use for one."""


def _traceback_to_stderr(shell):
    """IPython's way to show a traceback it caught (a failing ``_repr_html_``, an ``interact`` callback, an error
    in ``with Output():``), on the rank's stderr without colours: ipykernel's would send it on the kernel's
    connection (from a fork: lost, and through the display hook: an AttributeError)."""
    def show(etype, evalue, stb):
        text = _ANSI.sub("", shell.InteractiveTB.stb2text(stb))
        print(text, file=sys.stderr)

    return show


def _quiet_widgets(sender: RankDisplays) -> None:
    """A widget made in the rank would open a comm over the kernel's connection: a comm that goes nowhere, and
    one line saying so."""
    try:
        import comm
    except ImportError:
        return

    def create_comm(*args, **kwargs):
        if not sender.widget_noted:
            sender.widget_noted = True
            print(WIDGET_NOTE.format(name=_widget_name(sys._getframe(1))), file=sys.stderr)
        kwargs.pop("show_warning", None)
        return comm.DummyComm(*args, **kwargs)

    comm.create_comm = create_comm


def _widget_name(frame) -> str:
    """The class of the outermost widget being made a few frames up (an IntSlider, not the Layout it makes
    first), or "a widget"."""
    name = "a widget"
    for _ in range(16):
        if frame is None:
            break
        owner = frame.f_locals.get("self")
        if owner is not None and type(owner).__module__.startswith("ipywidgets"):
            name = type(owner).__name__
        frame = frame.f_back
    return name


def _console_tqdm() -> None:
    """``tqdm.notebook``'s class draws tqdm's console bar in a rank (on stderr, which the panel reads as the
    rank's progress): patched now if tqdm.notebook is loaded (a fork of a kernel that imported it), else when
    the rank imports it."""
    module = sys.modules.get("tqdm.notebook")
    if module is not None:
        _make_console(module)
        return
    sys.meta_path.insert(0, _TqdmNotebookFinder())


def _make_console(module) -> None:
    cls, std = getattr(module, "tqdm_notebook", None), getattr(module, "std_tqdm", None)
    if cls is None or std is None or getattr(cls, "_notebook_launcher_console", False):
        return

    def __init__(self, *args, **kwargs):
        kwargs.pop("display", None)
        std.__init__(self, *args, **kwargs)

    for name in ("__iter__", "update", "close", "clear", "reset", "display", "status_printer"):
        if name in std.__dict__:
            setattr(cls, name, std.__dict__[name])
    cls.__init__ = __init__
    cls._notebook_launcher_console = True


class _TqdmNotebookFinder:
    """Imports ``tqdm.notebook`` as usual, then gives it the console bar (``_make_console``)."""

    def find_spec(self, name, path=None, target=None):
        if name != "tqdm.notebook":
            return None
        import importlib.util

        sys.meta_path.remove(self)
        try:
            spec = importlib.util.find_spec(name)
        finally:
            sys.meta_path.insert(0, self)
        if spec is None or spec.loader is None:
            return None
        loader = spec.loader
        original = loader.exec_module

        def exec_module(module):
            original(module)
            _make_console(module)

        loader.exec_module = exec_module
        return spec


def _at_rank_end() -> None:
    """At the rank's end: held updates, the figures matplotlib's inline backend would show at a cell's end,
    and what the bounds left out."""
    sender = _sender
    if sender is None:
        return
    inline = sys.modules.get("matplotlib_inline.backend_inline")
    if inline is not None:
        try:
            inline.flush_figures()
        except Exception:  # noqa: BLE001 - a figure that cannot be drawn: the rank's end goes on
            pass
    sender.flush()
    summary = sender.summary()
    if summary:
        print(summary, file=sys.stderr)
