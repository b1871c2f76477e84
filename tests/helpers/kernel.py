"""A real Jupyter kernel (ipykernel, this interpreter, started by jupyter_client) and reading what one
execution sent: its reply, its outputs, the run panel among them."""

from __future__ import annotations

import contextlib
import os
import queue
import time

import psutil

from helpers.processes import _kill_leftovers

KERNEL_NAME = "python3"
PANEL_MIME = "application/vnd.notebook-launcher.run.v1+json"
KERNEL_START_S = 60
SHUTDOWN_S = 15


def _wait_until(condition, timeout: float, interval: float = 0.05) -> bool:
    """Poll ``condition`` until it holds (True) or ``timeout`` seconds pass (False)."""
    deadline = time.monotonic() + timeout
    while True:
        if condition():
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(interval)


@contextlib.contextmanager
def running_kernel(cwd, env=None, output=None):
    """A python3 ipykernel (this interpreter) with its client; shut down and checked gone on exit. ``output``: a
    file for the kernel's own stdout/stderr."""
    from jupyter_client import KernelManager

    km = KernelManager(kernel_name=KERNEL_NAME)
    redirect = {} if output is None else {"stdout": output, "stderr": output}
    km.start_kernel(cwd=str(cwd), env=dict(os.environ if env is None else env), **redirect)
    kernel = psutil.Process(km.provisioner.process.pid)
    kc = km.client()
    kc.start_channels()
    try:
        kc.wait_for_ready(timeout=KERNEL_START_S)
        yield km, kc, kernel
    finally:
        descendants = []
        with contextlib.suppress(psutil.Error):
            descendants = kernel.children(recursive=True)
        kc.stop_channels()
        try:
            km.shutdown_kernel(now=True)
        finally:
            _, alive = psutil.wait_procs([kernel], timeout=SHUTDOWN_S)
            _kill_leftovers(alive + descendants)
        assert not kernel.is_running(), "the kernel outlived its shutdown"


def _messages(get, msg_id: str, timeout: float, waiting_for: str):
    """The messages of one execution from one channel (``get``: the client's get_*_msg), within ``timeout``."""
    deadline = time.monotonic() + timeout
    while True:
        remaining = deadline - time.monotonic()
        try:
            if remaining <= 0:
                raise queue.Empty
            msg = get(timeout=remaining)
        except queue.Empty:
            raise TimeoutError(f"{waiting_for} within {timeout} s") from None
        if msg["parent_header"].get("msg_id") == msg_id:
            yield msg


def _shell_reply(kc, msg_id: str, timeout: float) -> dict:
    return next(_messages(kc.get_shell_msg, msg_id, timeout, "no execute reply"))


def _iopub_outputs(kc, msg_id: str, timeout: float) -> list[dict]:
    """The output messages of one execution, up to the kernel going idle after it."""
    outputs = []
    for msg in _messages(kc.get_iopub_msg, msg_id, timeout, "the kernel did not go idle"):
        if msg["msg_type"] == "status" and msg["content"]["execution_state"] == "idle":
            return outputs
        if msg["msg_type"] in ("stream", "execute_result", "display_data", "update_display_data", "error"):
            outputs.append(msg)


def run_cell(kc, code: str, timeout: float = 60) -> tuple[dict, list[dict]]:
    msg_id = kc.execute(code)
    reply = _shell_reply(kc, msg_id, timeout)
    return reply, _iopub_outputs(kc, msg_id, timeout)


def _stream(outputs: list[dict], name: str = "stdout") -> str:
    return "".join(m["content"]["text"] for m in outputs if m["msg_type"] == "stream" and m["content"]["name"] == name)


def _panel(outputs: list[dict]) -> dict:
    """The run panel's latest state among an execution's messages (its display, then its updates)."""
    panels = [m["content"]["data"][PANEL_MIME] for m in outputs
              if m["msg_type"] in ("display_data", "update_display_data") and PANEL_MIME in m["content"]["data"]]
    assert panels, f"no run panel among {[m['msg_type'] for m in outputs]}"
    return panels[-1]


def _panel_lines(panel: dict, rank: int) -> list[str]:
    return [line["text"] for line in panel["ranks"][rank]["lines"]]


def _result(outputs: list[dict]) -> str | None:
    for msg in outputs:
        if msg["msg_type"] == "execute_result":
            return msg["content"]["data"].get("text/plain")
    return None


def _assert_ok(reply: dict, outputs: list[dict]) -> None:
    content = reply["content"]
    assert content["status"] == "ok", (
        f"{content.get('ename')}: {content.get('evalue')}\n" + "\n".join(content.get("traceback", []))
        + "\n" + _stream(outputs) + _stream(outputs, "stderr"))


@contextlib.contextmanager
def kernel_with_log(tmp_path, env):
    """A python3 ipykernel whose own stdout/stderr (where ipykernel logs a send from a fork) go to a file."""
    log_path = tmp_path / "kernel.log"
    with open(log_path, "w") as log, running_kernel(tmp_path, env, output=log) as (_km, kc, _kernel):
        yield kc, log_path


def _env(runs_dir) -> dict:
    return {**os.environ, "NOTEBOOK_LAUNCHER_RUNS_DIR": str(runs_dir)}


def _rank_outputs(outputs):
    """The cell's outputs other than the panel: [(display_id, [bundle, update, ...])] in order."""
    shown: dict[str, list] = {}
    for msg in outputs:
        content = msg["content"]
        if msg["msg_type"] not in ("display_data", "update_display_data") or PANEL_MIME in content["data"]:
            continue
        display_id = content.get("transient", {}).get("display_id")
        if msg["msg_type"] == "display_data":
            shown[display_id] = [content["data"]]
        else:
            shown[display_id].append(content["data"])
    return list(shown.items())
