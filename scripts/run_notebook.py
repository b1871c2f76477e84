#!/usr/bin/env python
"""Run a notebook end to end in a real Jupyter kernel and show what each cell printed.

    python scripts/run_notebook.py notebooks/quickstart.ipynb

This is what ``make demo`` runs. The notebook is executed with nbclient in an ipykernel ``python3`` kernel that
uses the interpreter running this script (so the kernel sees the same environment), with the notebook's folder as
its working directory. As each cell finishes, its source (first lines) and its text outputs (streams,
``text/plain`` results, errors) are printed here. The executed notebook is saved next to the original as
``<name>.executed.ipynb``, also when a cell fails. Execution stops at the first failing cell, and the exit status
is then 1 (2 for a bad command line).
"""

from __future__ import annotations

import argparse
import os
import re
import sys
import time

_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
_HEADER_LINES = 3


def executed_path(path: str) -> str:
    """``dir/name.ipynb`` -> ``dir/name.executed.ipynb``."""
    root, ext = os.path.splitext(path)
    return f"{root}.executed{ext or '.ipynb'}"


def _text(value) -> str:
    return "".join(value) if isinstance(value, list) else str(value)


def _indent(text: str, prefix: str = "    ") -> str:
    return "".join(prefix + line + "\n" for line in text.rstrip("\n").split("\n"))


def format_outputs(outputs) -> str:
    """The text a terminal user wants to see from a cell's outputs."""
    parts = []
    for output in outputs:
        kind = output.get("output_type")
        if kind == "stream":
            parts.append(_text(output.get("text", "")))
        elif kind in ("execute_result", "display_data"):
            data = output.get("data", {})
            if "text/plain" in data:
                parts.append(_text(data["text/plain"]) + "\n")
            elif data:
                parts.append(f"<{', '.join(sorted(data))}>\n")
        elif kind == "error":
            traceback = "\n".join(output.get("traceback") or [])
            parts.append(_ANSI.sub("", traceback) or f"{output.get('ename')}: {output.get('evalue')}")
            parts.append("\n")
    return "".join(parts)


def cell_header(cell, index: int, total: int) -> str:
    lines = _text(cell.get("source", "")).strip("\n").split("\n")
    shown = lines[:_HEADER_LINES] + (["..."] if len(lines) > _HEADER_LINES else [])
    return f"--- cell {index + 1}/{total} " + "-" * 60 + "\n" + "".join(f">>> {line}\n" for line in shown)


def _this_interpreter_kernel_manager():
    """An AsyncKernelManager whose ``python3`` is always ipykernel on this interpreter (``sys.executable``), even
    when a user-level ``python3`` kernelspec points at another environment."""
    from jupyter_client import AsyncKernelManager
    from jupyter_client.kernelspec import KernelSpecManager
    from traitlets import default

    class ThisInterpreterKernelManager(AsyncKernelManager):
        @default("kernel_spec_manager")
        def _kernel_spec_manager_default(self):
            return KernelSpecManager(kernel_dirs=[])  # only the native kernel, made from this interpreter

    return ThisInterpreterKernelManager


def run_notebook(path: str, timeout: int = 600, kernel_name: str = "python3", out=sys.stdout) -> int:
    """Execute ``path``, save ``<name>.executed.ipynb`` next to it, return a process exit status."""
    import nbformat
    from nbclient import NotebookClient
    from nbclient.exceptions import CellExecutionError, CellTimeoutError, DeadKernelError

    path = os.path.abspath(path)
    notebook = nbformat.read(path, as_version=4)
    code_cells = [index for index, cell in enumerate(notebook.cells) if cell.cell_type == "code"]
    started = {}

    def on_cell_start(cell, cell_index, **_):
        started[cell_index] = time.monotonic()

    def on_cell_executed(cell, cell_index, execute_reply, **_):
        elapsed = time.monotonic() - started.get(cell_index, time.monotonic())
        position = code_cells.index(cell_index) if cell_index in code_cells else cell_index
        out.write(cell_header(cell, position, len(code_cells)))
        text = format_outputs(cell.get("outputs", []))
        if text.strip():
            out.write(_indent(text))
        status = (execute_reply or {}).get("content", {}).get("status", "?")
        out.write(f"    ({status}, {elapsed:.1f} s)\n")
        out.flush()

    client = NotebookClient(
        notebook,
        timeout=timeout,
        kernel_name=kernel_name,
        resources={"metadata": {"path": os.path.dirname(path)}},  # the kernel's working directory
        on_cell_start=on_cell_start,
        on_cell_executed=on_cell_executed,
    )
    if kernel_name == "python3":
        client.kernel_manager_class = _this_interpreter_kernel_manager()
    target = executed_path(path)
    begin = time.monotonic()
    status = 0
    try:
        client.execute()
    except CellExecutionError as error:  # the failing cell was printed by on_cell_executed
        status = 1
        out.write(f"\nFAILED: a cell raised {str(error).strip().splitlines()[-1] if str(error).strip() else ''}\n")
    except (CellTimeoutError, DeadKernelError) as error:
        status = 1
        out.write(f"\nFAILED: {type(error).__name__}: {error}\n")
    finally:
        nbformat.write(notebook, target)
    elapsed = time.monotonic() - begin
    verdict = "failed" if status else "ran"
    out.write(f"\n{os.path.relpath(path)} {verdict} in {elapsed:.1f} s; executed notebook: {os.path.relpath(target)}\n")
    out.flush()
    return status


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("path", help="the .ipynb to run")
    parser.add_argument("--timeout", type=int, default=600, help="seconds one cell may run (default: 600)")
    parser.add_argument("--kernel", default="python3", help="kernel name (default: python3)")
    options = parser.parse_args(argv)
    if not os.path.isfile(options.path):
        parser.error(f"no such notebook: {options.path}")
    return run_notebook(options.path, timeout=options.timeout, kernel_name=options.kernel)


if __name__ == "__main__":
    sys.exit(main())
