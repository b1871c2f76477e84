"""The event schema and what both sides share: the kinds of events (declared once, ``kinds.py``), the events and
their frames, the kernel's checked reader of them, runs of lines, the progress record, results, the run log on
disk, process trees. It imports nothing of ours outside itself."""
