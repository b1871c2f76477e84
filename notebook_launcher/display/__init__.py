"""How a run is shown in the kernel: text everywhere, the JupyterLab panel where it can be, the inspector after.

Modules: ``protocol`` (what a display is), ``describe`` (how each kind of event reads as text), ``text``
(the text display), ``state``/``fallback``/``panel`` (the live panel: its state, its text and HTML, its
output), ``logreader``/``logview``/``inspector`` (a run log read back, filtered and paged, and its widget).
"""

from .protocol import Display, is_display
from .text import TextDisplay

__all__ = ["Display", "TextDisplay", "is_display"]
