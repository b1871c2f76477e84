"""How a run is shown in the kernel: text everywhere (the JupyterLab panel builds on the same events)."""

from .text import TextDisplay

__all__ = ["TextDisplay"]
