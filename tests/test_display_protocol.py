"""The Display protocol (display/protocol.py): what the launcher calls on a display, and a display of one's own
passed to a real launch."""

from __future__ import annotations

import pytest

from notebook_launcher import LaunchArgumentError, notebook_launcher
from notebook_launcher.display import Display, TextDisplay, is_display
from notebook_launcher.display.panel import PanelDisplay
from notebook_launcher.display.protocol import FinishingDisplay
from notebook_launcher.display.state import RunState
from notebook_launcher.launchers.agent import ForwardingDisplay
from notebook_launcher.schema.events import EXIT, STATUS, STREAM


class Collecting:
    """A display of one's own: keeps what the launcher gives it (structurally a Display, not a subclass)."""

    def __init__(self):
        self.events, self.notes, self.ticks, self.targets = [], [], 0, []

    def show(self, event) -> None:
        self.events.append(event)

    def note(self, text: str) -> None:
        self.notes.append(text)

    def tick(self) -> None:
        self.ticks += 1

    def retarget(self, node_rank, ranks) -> None:
        self.targets.append((node_rank, list(ranks)))


def greet():
    import torch.distributed as dist

    print(f"hello from {dist.get_rank()}")
    return dist.get_rank()


def test_the_displays_of_the_package_are_displays():
    panel = PanelDisplay(RunState("r", "/tmp/r", "cpu", "gloo", "fork", 2, 2, [0, 1]))
    for display in (TextDisplay("[rank ${rank}] "), panel, ForwardingDisplay(writer=None), Collecting()):
        assert is_display(display) and isinstance(display, Display)
    assert isinstance(panel, FinishingDisplay) and not isinstance(TextDisplay(""), FinishingDisplay)


def test_what_lacks_a_method_or_is_a_name_is_not_a_display():
    class NoTick:
        def show(self, event): ...
        def note(self, text): ...
        def retarget(self, node_rank, ranks): ...

    for thing in (NoTick(), "text", None, print):
        assert not is_display(thing)


@pytest.mark.processes
def test_a_display_of_ones_own_gets_every_event_of_a_real_launch():
    display = Collecting()
    assert notebook_launcher(greet, num_processes=2, device="cpu", display=display) == 0
    lines = sorted(event.data["text"] for event in display.events if event.kind == STREAM)
    assert lines == ["hello from 0", "hello from 1"]
    assert {event.rank for event in display.events if event.kind == EXIT} == {0, 1}
    assert [event.data["state"] for event in display.events if event.kind == STATUS and event.rank == 0][0] == \
        "starting"
    assert any(note.startswith("2 processes on cpu (gloo)") for note in display.notes)


@pytest.mark.processes
def test_anything_else_is_refused_with_the_choices():
    with pytest.raises(LaunchArgumentError, match=r"display=<object .*> is not one of 'auto', 'panel', 'text'"):
        notebook_launcher(greet, num_processes=2, device="cpu", display=object())
