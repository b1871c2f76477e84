"""get_logger inside a real Jupyter kernel (ipykernel, driven by nbclient), as a notebook user sees it.

A notebook built with nbformat is executed cell by cell:

- a launched function on 3 ranks logs ``logger.info`` (rank 0 only), ``logger.debug(main_process_only=False)``
  (every rank), and 21 ``in_order=True`` calls, 20 of them with rank 0 sleeping a random 0-20 ms before each:
  the launching cell's stdout holds exactly the expected ``[rank N] LEVEL logger: message`` lines of each rank,
  and every in_order group shows rank 0, 1, 2 in that order;
- ``last_run().events`` in the kernel holds the same records as structured ``log`` events (level, logger,
  message, the user's file, line and function, the rank's in_order count);
- plain ``logging.getLogger(...).warning`` and ``warnings.warn`` in the workers show as
  ``[rank N] WARNING plain: ...`` and ``[rank N] WARNING py.warnings: ...`` in the cell's stdout, not stderr.

The kernel is shut down on exit, bounded in time, and the test checks that it and its children are gone.
"""

from __future__ import annotations

import contextlib
import json
import re

import psutil
import pytest
from helpers.kernel import KERNEL_NAME, SHUTDOWN_S
from helpers.processes import _kill_leftovers
from nbformat.v4 import new_code_cell, new_notebook

pytestmark = [pytest.mark.processes, pytest.mark.kernel]

CELL_TIMEOUT_S = 60
RANKS = (0, 1, 2)
CALLS = 20

LAUNCH_CELL = '''\
import random, time
from notebook_launcher import get_logger, last_run, notebook_launcher

def work(calls):
    import torch.distributed as dist
    rank = dist.get_rank()
    logger = get_logger("mymodule", log_level="DEBUG")
    logger.info("on the main process only")
    logger.debug(f"every rank, from rank {rank}", main_process_only=False)
    logger.debug(f"in order, from rank {rank}", main_process_only=False, in_order=True)
    for call in range(calls):
        if rank == 0:
            time.sleep(random.uniform(0, 0.02))
        logger.debug(f"call {call} from rank {rank}", main_process_only=False, in_order=True)
    return rank

notebook_launcher(work, args=(CALLS,), num_processes=3, device="cpu")
'''

EVENTS_CELL = '''\
import json
print(json.dumps([{"rank": e.rank, **{key: e.data.get(key) for key in
                   ("level", "logger", "message", "file", "line", "function", "in_order")}}
                  for e in last_run().events if e.kind == "log"]))
'''

PLAIN_CELL = '''\
import logging, warnings

def plain():
    import torch.distributed as dist
    rank = dist.get_rank()
    logging.getLogger("plain").warning(f"a plain warning from rank {rank}")
    warnings.warn(f"careful, rank {rank}")
    return rank

notebook_launcher(plain, num_processes=3, device="cpu")
'''


# -- helpers ------------------------------------------------------------------------------------------------------
def _text(outputs, name: str) -> str:
    """All stream outputs of one name, concatenated (ipykernel splits a cell's stdout into several)."""
    return "".join(o.text for o in outputs if o.output_type == "stream" and o.name == name)


def _rank_lines(text: str, rank: int) -> list[str]:
    prefix = f"[rank {rank}] "
    return [line[len(prefix):] for line in text.splitlines() if line.startswith(prefix)]


def _result(outputs) -> str | None:
    results = [o for o in outputs if o.output_type == "execute_result"]
    return results[0].data["text/plain"] if len(results) == 1 else None


def _cell_line(source: str, needle: str) -> int:
    """1-based line number of the only line of a cell that contains ``needle`` (IPython numbers lines per cell)."""
    matches = [number for number, line in enumerate(source.splitlines(), 1) if needle in line]
    assert len(matches) == 1, (needle, matches)
    return matches[0]


def _execute_notebook(notebook, cwd) -> None:
    """Execute every cell in a fresh kernel; afterwards the kernel and every process it started are gone."""
    from nbclient import NotebookClient

    client = NotebookClient(notebook, timeout=CELL_TIMEOUT_S, kernel_name=KERNEL_NAME,
                            resources={"metadata": {"path": str(cwd)}})
    kernel = None
    descendants: list[psutil.Process] = []
    try:
        with client.setup_kernel():
            kernel = psutil.Process(client.km.provisioner.process.pid)
            try:
                for index, cell in enumerate(notebook.cells):
                    client.execute_cell(cell, index)
            except Exception as error:  # noqa: BLE001 - show what the cells printed before one failed or hung
                pytest.fail(f"{type(error).__name__}: {error}\noutputs so far: "
                            + "\n".join(str(cell.get("outputs")) for cell in notebook.cells))
            finally:
                with contextlib.suppress(psutil.Error):
                    descendants = kernel.children(recursive=True)
    finally:
        alive = []
        if kernel is not None:
            _, alive = psutil.wait_procs([kernel], timeout=SHUTDOWN_S)
        _kill_leftovers(alive + descendants)
    assert not alive, "the kernel outlived its shutdown"
    assert descendants == [], f"processes left after the launches: {descendants}"


# -- the test -------------------------------------------------------------------------------------------------------
@pytest.mark.slow
def test_rank_aware_logging_in_a_kernel_shows_exactly_the_expected_lines_in_rank_order(tmp_path, runs_dir,
                                                                                      monkeypatch):
    monkeypatch.setenv("NOTEBOOK_LAUNCHER_DISPLAY", "text")  # the kernel inherits it: the text display's lines
    notebook = new_notebook(cells=[new_code_cell(f"CALLS = {CALLS}"), new_code_cell(LAUNCH_CELL),
                                   new_code_cell(EVENTS_CELL), new_code_cell(PLAIN_CELL)],
                            metadata={"kernelspec": {"name": KERNEL_NAME, "display_name": "Python 3",
                                                     "language": "python"}})
    _execute_notebook(notebook, tmp_path)
    for cell in notebook.cells:
        errors = [o for o in cell.outputs if o.output_type == "error"]
        assert not errors, "\n".join(f"{o.ename}: {o.evalue}" for o in errors) + "\n" + _text(cell.outputs, "stdout")

    # (1) the launching cell's stdout: exactly the expected lines of each rank
    outputs = notebook.cells[1].outputs
    stdout, stderr = _text(outputs, "stdout"), _text(outputs, "stderr")
    lines = stdout.splitlines()
    assert lines[0].startswith("notebook_launcher: 3 processes on cpu (gloo), start method "), stdout
    assert all(re.match(r"\[rank [012]\] ", line) for line in lines[1:]), stdout  # nothing else, nothing glued
    for rank in RANKS:
        expected = (["INFO mymodule: on the main process only"] if rank == 0 else []) + [
            f"DEBUG mymodule: every rank, from rank {rank}",
            f"DEBUG mymodule: in order, from rank {rank}",
        ] + [f"DEBUG mymodule: call {call} from rank {rank}" for call in range(CALLS)]
        assert _rank_lines(stdout, rank) == expected, f"rank {rank}:\n{stdout}"
    assert not _rank_lines(stderr, 0) + _rank_lines(stderr, 1) + _rank_lines(stderr, 2), stderr
    assert _result(outputs) == "0", outputs

    # every in_order group shows rank 0, 1, 2 in that order, and groups come one after the other
    groups = ["in order, from rank {rank}"] + [f"call {call} from rank {{rank}}" for call in range(CALLS)]
    in_order = [line for line in lines if re.search(r"DEBUG mymodule: (in order, from|call \d+ from) rank", line)]
    assert in_order == [f"[rank {rank}] DEBUG mymodule: " + group.format(rank=rank)
                        for group in groups for rank in RANKS], stdout

    # (2) the same records in last_run().events, with the user's call site and each rank's in_order count
    records = json.loads(_text(notebook.cells[2].outputs, "stdout"))
    source = LAUNCH_CELL
    for rank in RANKS:
        mine = [record for record in records if record["rank"] == rank]
        assert [f"{r['level']} {r['logger']}: {r['message']}" for r in mine] == _rank_lines(stdout, rank), mine
        assert {(r["function"], r["file"]) for r in mine} == {("work", mine[0]["file"])}, mine
        expected_lines = ([_cell_line(source, "logger.info(")] if rank == 0 else []) + [
            _cell_line(source, "every rank, from rank"), _cell_line(source, "in order, from rank")
        ] + [_cell_line(source, "call {call} from rank")] * CALLS
        assert [r["line"] for r in mine] == expected_lines, mine
        assert [r["in_order"] for r in mine] == [None] * (2 if rank == 0 else 1) + list(range(1, CALLS + 2)), mine

    # (3) plain logging and warnings.warn in the workers: one record each per rank, in the cell's stdout
    outputs = notebook.cells[3].outputs
    stdout, stderr = _text(outputs, "stdout"), _text(outputs, "stderr")
    assert "careful" not in stderr and "a plain warning" not in stderr, stderr
    warn_line = _cell_line(PLAIN_CELL, "warnings.warn(")
    for rank in RANKS:
        mine = _rank_lines(stdout, rank)
        assert mine[0] == f"WARNING plain: a plain warning from rank {rank}", stdout
        assert re.fullmatch(rf"WARNING py\.warnings: \S+\.py:{warn_line}: UserWarning: careful, rank {rank}",
                            mine[1]), stdout
        # logging.captureWarnings formats the warning with its source line when linecache has the cell's code
        assert mine[2:] in ([], ['  warnings.warn(f"careful, rank {rank}")']), stdout
    assert _result(outputs) == "0", outputs
