"""One attempt's processes on this machine, seen from the kernel: start, watch, read and stop them; the root
cause of a failure; in-order release of log records."""
