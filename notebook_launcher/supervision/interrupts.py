"""Ctrl-C / a kernel interrupt while the kernel supervises processes, deferred to a point where it is safe.

A KeyboardInterrupt raised wherever the interpreter happens to be could land half-way through a fork, a read of
a worker's pipe or a reap, and leave a process or an fd behind. Used by the supervisor of one node's workers and
by the launch across hosts; knows nothing of either.
"""

from __future__ import annotations

import os
import signal
import threading


class DeferredInterrupt:
    """While active (main thread only), SIGINT increments ``count`` and writes one byte to ``wake_fd`` (so a
    selector waiting on its read end wakes up) instead of raising KeyboardInterrupt. The previous handler is
    restored on exit; the caller decides what an interrupt means (usually: stop everyone, then raise)."""

    def __init__(self, wake_fd: int | None):
        self.count = 0
        self._wake_fd = wake_fd
        self._previous = None

    def __enter__(self):
        if self._wake_fd is not None and threading.current_thread() is threading.main_thread():
            self._previous = signal.signal(signal.SIGINT, self._on_sigint)
        return self

    def _on_sigint(self, signum, frame):
        self.count += 1
        try:
            os.write(self._wake_fd, b"\0")
        except OSError:
            pass

    def __exit__(self, *exc_info):
        if self._previous is not None:
            signal.signal(signal.SIGINT, self._previous)
        return False
