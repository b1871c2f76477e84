"""The harness of the benchmark scripts (``from common import ...``: a script's own folder is on sys.path).

Every benchmark starts from ``arguments(__doc__, NAME)`` (``--output``, ``--smoke``), reads them with
``parse(parser, argv, smoke={...})`` (its tiny settings for a smoke run) and ends with ``finish(args, results,
headline)``: its results file, with its headline figures (the ratios it is there to report). ``run.py`` runs any
of them (``make bench``; ``make bench B=NAME``); tests/test_benchmarks_smoke.py runs each with ``--smoke``.

Importing this module also puts the repository root on sys.path, so that the scripts import the
``notebook_launcher`` of this checkout.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import queue as queue_module
import socket
import statistics
import sys
import threading
import time
import traceback

import psutil

HERE = os.path.dirname(os.path.abspath(__file__))  # benchmarks/
ROOT = os.path.dirname(HERE)
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

KERNEL_START_S = 60  # a kernel that is not ready by then is an error
SHUTDOWN_S = 15  # a kernel that has not exited this long after shutdown is killed (with what it started)
KILL_WAIT_S = 5.0  # kill_all(..., wait_s=KILL_WAIT_S): how long to wait for the killed processes to go
OUTPUT_MSG_TYPES = ("stream", "display_data", "update_display_data", "execute_result", "error")


# --------------------------------------------------------------------------------------------------------------
# Numbers and text
# --------------------------------------------------------------------------------------------------------------
def median(values):
    """The median of the values that are not None; None if there are none."""
    values = [value for value in values if value is not None]
    return statistics.median(values) if values else None


def ratio(numerator, denominator):
    """numerator / denominator, or None where either is missing or the denominator is not positive."""
    if numerator is None or denominator is None or denominator <= 0:
        return None
    return numerator / denominator


def fmt_ratio(value, missing: str = "n/a") -> str:
    return missing if value is None else f"{value:.2f}x"


def ms(value, digits: int = 0) -> str:
    """Seconds shown as milliseconds ("n/a" for None)."""
    return "n/a" if value is None else f"{value * 1000:.{digits}f}"


def table(header, rows) -> str:
    """A text table: the first column left-aligned, the others right-aligned."""
    widths = [max(len(str(row[i])) for row in [header, *rows]) for i in range(len(header))]
    out = [" | ".join(str(h).ljust(w) for h, w in zip(header, widths)), "-+-".join("-" * w for w in widths)]
    for row in rows:
        out.append(" | ".join([str(row[0]).ljust(widths[0])] + [str(c).rjust(w) for c, w in zip(row[1:], widths[1:])]))
    return "\n".join(out)


def log(text: str, file=None) -> None:
    """A progress line, flushed at once; on stderr unless ``file`` says otherwise."""
    print(text, file=sys.stderr if file is None else file, flush=True)


def write_json(path: str, data, default=str) -> None:
    """The results file, its folder created if needed."""
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w", encoding="utf-8") as out:
        json.dump(data, out, indent=2, default=default)


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


# --------------------------------------------------------------------------------------------------------------
# The harness: arguments, smoke runs, the results file and its headline
# --------------------------------------------------------------------------------------------------------------
def arguments(doc: str, name: str) -> argparse.ArgumentParser:
    """The parser every benchmark adds its own options to: its description (the docstring's first paragraph),
    ``--output`` (default ``benchmarks/results/NAME.json``) and ``--smoke``."""
    parser = argparse.ArgumentParser(prog=f"{name}.py", description=doc.strip().split("\n\n")[0])
    parser.set_defaults(name=name)
    parser.add_argument("--output", default=None, help=f"where to write the JSON results (results/{name}.json)")
    parser.add_argument("--smoke", action="store_true",
                        help="a tiny size and one repetition: that it runs and reports its figures (not a "
                             "measurement; written to results/smoke/)")
    return parser


def parse(parser: argparse.ArgumentParser, argv=None, smoke: dict | None = None) -> argparse.Namespace:
    """The arguments; with ``--smoke`` the benchmark's tiny settings (``smoke``) replace the defaults."""
    args = parser.parse_args(argv)
    if args.smoke:
        for key, value in (smoke or {}).items():
            setattr(args, key, value)
    if args.output is None:
        args.output = os.path.join(HERE, "results", *(["smoke"] if args.smoke else []), f"{args.name}.json")
    return args


def finish(args: argparse.Namespace, results: dict, headline: dict, default=str) -> int:
    """Writes ``results`` and ``headline`` (the benchmark's main figures, ``{label: ratio}``, None where one
    could not be measured) to ``args.output`` and prints the headline; 0, the exit status."""
    write_json(args.output, {**results, "headline": headline, "smoke": args.smoke}, default=default)
    print("headline: " + "; ".join(f"{label} {fmt_ratio(value)}" for label, value in headline.items()))
    print(f"wrote {os.path.relpath(args.output)}")
    return 0


# --------------------------------------------------------------------------------------------------------------
# Processes
# --------------------------------------------------------------------------------------------------------------
def live_descendants(pid: int | None = None) -> list[psutil.Process]:
    """Every live (not zombie) process below ``pid`` (default: this process)."""
    try:
        children = psutil.Process(pid).children(recursive=True)
    except psutil.NoSuchProcess:
        return []
    found = []
    for child in children:
        try:
            if child.status() != psutil.STATUS_ZOMBIE:
                found.append(child)
        except psutil.NoSuchProcess:
            continue
    return found


def kill_all(processes, wait_s: float = 0.0) -> list[int]:
    """SIGKILL what is still ours (psutil checks PIDs were not reused); the PIDs that had to be killed. With
    ``wait_s``, wait up to that long for them to go (and reap those that are our children)."""
    processes = list(processes)
    killed = []
    for process in processes:
        with contextlib.suppress(psutil.Error):
            if process.is_running():
                process.kill()
                killed.append(process.pid)
    if wait_s:
        psutil.wait_procs(processes, timeout=wait_s)
    return killed


def exit_with(main) -> None:
    """``sys.exit(main())``; on an error in the script itself, every process it started is killed first, so
    that a benchmark never leaves processes behind."""
    try:
        sys.exit(main())
    except Exception:  # noqa: BLE001 - never leave processes behind, even on a bug in the script
        kill_all(live_descendants(os.getpid()))
        traceback.print_exc()
        sys.exit(1)


def kill_descendants(keep=(), wait_s: float = 0.0) -> list[int]:
    """SIGKILL every live process below this one except the PIDs in ``keep``; the PIDs killed."""
    return kill_all([p for p in live_descendants() if p.pid not in keep], wait_s)


class Watchdog:
    """Kills this process's descendants (except the PIDs in ``keep``: long-lived helpers such as an sshd listener)
    if a call overruns, so that a hung launcher cannot hang the benchmark. ``before_kill()``, if given, runs first
    (to note where the hung processes wait). ``fired`` says whether it did."""

    def __init__(self, seconds: float, keep=(), before_kill=None):
        self.fired = False
        self.keep = set(keep)
        self.before_kill = before_kill
        self._timer = threading.Timer(seconds, self._fire)
        self._timer.daemon = True

    def _fire(self):
        self.fired = True
        if self.before_kill is not None:
            self.before_kill()
        kill_descendants(self.keep)

    def __enter__(self):
        self._timer.start()
        return self

    def __exit__(self, *exc):
        self._timer.cancel()
        return False


class Quiet:
    """fd 1/2 and sys.stdout/sys.stderr go to the log file for the duration of one call (every method alike):
    ``with quiet(): ...``."""

    def __init__(self, log_path: str):
        self.log_fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)

    @contextlib.contextmanager
    def __call__(self):
        sys.stdout.flush()
        sys.stderr.flush()
        saved = os.dup(1), os.dup(2)
        os.dup2(self.log_fd, 1)
        os.dup2(self.log_fd, 2)
        try:
            with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
                yield
        finally:
            os.dup2(saved[0], 1)
            os.dup2(saved[1], 2)
            os.close(saved[0])
            os.close(saved[1])

    def close(self):
        os.close(self.log_fd)


# --------------------------------------------------------------------------------------------------------------
# A real kernel (jupyter_client, ipykernel)
# --------------------------------------------------------------------------------------------------------------
def kernel_env(directory: str) -> dict:
    """This process's environment for a kernel: run logs under ``directory``/kernel-runs, this checkout first on
    PYTHONPATH."""
    return {**os.environ, "NOTEBOOK_LAUNCHER_RUNS_DIR": os.path.join(directory, "kernel-runs"),
            "PYTHONPATH": os.pathsep.join(p for p in (ROOT, os.environ.get("PYTHONPATH", "")) if p)}


class Kernel:
    """A python3 ipykernel and its client; ``close()`` shuts it down, bounded in time, and kills leftovers."""

    def __init__(self, cwd: str, env: dict, cell_timeout_s: float = 120.0):
        from jupyter_client import KernelManager

        self.cell_timeout_s = cell_timeout_s
        self.km = KernelManager(kernel_name="python3")
        self.km.start_kernel(cwd=cwd, env=env)
        self.process = psutil.Process(self.km.provisioner.process.pid)
        self.kc = self.km.client()
        self.kc.start_channels()
        self.kc.wait_for_ready(timeout=KERNEL_START_S)

    def run(self, code: str, timeout: float | None = None) -> dict:
        """Execute one cell (``timeout``: default the kernel's ``cell_timeout_s``; on overrun the kernel is
        interrupted and TimeoutError raised). Returns ``reply_s`` and ``idle_s`` (seconds from execute to the
        execute reply and to the kernel going idle: every output sent), ``stdout`` and ``stderr`` (the stream
        texts; a traceback goes to stderr) and ``outputs``: the cell's IOPub output messages in arrival order,
        each ``{"t": seconds since execute, "msg_type": ..., "content": ...}``."""
        import zmq

        timeout = self.cell_timeout_s if timeout is None else timeout
        poller = zmq.Poller()
        shell, iopub = self.kc.shell_channel.socket, self.kc.iopub_channel.socket
        poller.register(shell, zmq.POLLIN)
        poller.register(iopub, zmq.POLLIN)
        start = time.perf_counter()
        msg_id = self.kc.execute(code)
        reply = reply_s = idle_s = None
        stdout, stderr, outputs = [], [], []
        deadline = time.monotonic() + timeout
        while idle_s is None or reply is None:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                self.km.interrupt_kernel()
                raise TimeoutError(f"cell did not finish within {timeout} s: {code[:80]!r}")
            ready = dict(poller.poll(timeout=min(remaining, 1.0) * 1000))
            if reply is None and shell in ready:
                with contextlib.suppress(queue_module.Empty):
                    message = self.kc.get_shell_msg(timeout=0)
                    if message["parent_header"].get("msg_id") == msg_id:
                        reply, reply_s = message, time.perf_counter() - start
            if idle_s is None and iopub in ready:
                try:
                    message = self.kc.get_iopub_msg(timeout=0)
                except queue_module.Empty:
                    continue
                if message["parent_header"].get("msg_id") != msg_id:
                    continue
                kind, content = message["msg_type"], message["content"]
                if kind in OUTPUT_MSG_TYPES:
                    outputs.append({"t": time.perf_counter() - start, "msg_type": kind, "content": content})
                if kind == "stream":
                    (stdout if content["name"] == "stdout" else stderr).append(content["text"])
                elif kind == "error":
                    stderr.append("\n".join(content["traceback"]))
                elif kind == "status" and content["execution_state"] == "idle":
                    idle_s = time.perf_counter() - start
        if reply["content"]["status"] != "ok":
            raise RuntimeError(f"cell failed: {reply['content'].get('ename')}: {reply['content'].get('evalue')}\n"
                               + "".join(stderr)[-3000:])
        return {"reply_s": reply_s, "idle_s": idle_s, "stdout": "".join(stdout), "stderr": "".join(stderr),
                "outputs": outputs}

    def close(self) -> dict:
        """Shut the kernel down; ``kernel_gone``: it exited within SHUTDOWN_S, ``killed``: the PIDs (the kernel
        and what it started) that had to be killed."""
        descendants = []
        with contextlib.suppress(psutil.Error):
            descendants = self.process.children(recursive=True)
        self.kc.stop_channels()
        with contextlib.suppress(Exception):
            self.km.shutdown_kernel(now=True)
        gone, alive = psutil.wait_procs([self.process], timeout=SHUTDOWN_S)
        killed = kill_all(alive + descendants, wait_s=KILL_WAIT_S)
        return {"kernel_gone": not self.process.is_running() or bool(gone), "killed": killed}
