"""An allocation asked of Slurm for one launch (``slurm_options=[...]`` from outside a job, e.g. a login node).

``salloc [options] -- sh -c HOLDER``: salloc asks for the job and, once granted, runs the holder on this machine.
The holder prints the job's id, nodes and CPUs per node, then waits for its stdin to end. The agents then run as
steps of that job (``srun --jobid``, ``starts.SrunStart``), as they do inside an allocation; a restart or an
out-of-memory step down reuses it. Why salloc with a holder rather than ``salloc --no-shell`` or ``sbatch``:

- the job's id is known while it waits (salloc says ``Pending job allocation N`` at once), so the display can
  show it with squeue's reason, and a stop can ``scancel`` it;
- the allocation lives exactly as long as the holder's stdin, which is a pipe from this kernel: when the launch
  ends, closing it gives the allocation back; if the kernel dies, the pipe ends and salloc gives it back too
  (``--no-shell`` or a batch job would outlive the kernel until their time limit);
- no batch step holds the CPUs of the first node, no output file is written.

salloc runs in a session of its own: a kernel interrupt (SIGINT to the kernel's process group) reaches the
launch, which cancels the job, not salloc.
"""

from __future__ import annotations

import contextlib
import os
import re
import selectors
import shutil
import signal
import subprocess
import time

from ..errors import LaunchArgumentError
from .slurm_job import STEP_NAME, SlurmError, SlurmJob, checked_id, job_from_fields, run_slurm, scancel, slurm_env

_MARK = "NOTEBOOK-LAUNCHER-ALLOCATION"
HOLDER = (f'printf "{_MARK} %s %s %s\\n" "$SLURM_JOB_ID" "$SLURM_JOB_NODELIST" "$SLURM_JOB_CPUS_PER_NODE"; '
          f'exec cat >/dev/null')
POLL_S = 2.0  # squeue's reason is asked this often while the job waits
RELEASE_S = 30.0  # how long salloc may take to give the allocation back
_JOB_ID = re.compile(r"(?:Pending job allocation|Granted job allocation|job) ([0-9]+)")


class Allocation:
    """``wait(timeout)`` asks for the job and returns it once granted (or None: ``ended`` says why);
    ``release()`` gives it back, whatever state it is in. ``note`` gets what the display should say."""

    def __init__(self, options: list[str], note, on_tick=None, asked=None):
        self.options = list(options)  # salloc's
        self.asked = list(options if asked is None else asked)  # the user's slurm_options
        self.note = note
        self.on_tick = on_tick or (lambda: None)
        self.job_id: str | None = None
        self.reason: str | None = None
        self.ended: str | None = None  # "interrupted" | "timeout", when wait returned None
        self.said: list[str] = []  # salloc's stderr lines
        self.process: subprocess.Popen | None = None
        self.granted = False
        self._released = False

    def command(self) -> list[str]:
        return [shutil.which("salloc") or "salloc", f"--job-name={STEP_NAME}", *self.options, "--", "sh", "-c",
                HOLDER]

    def wait(self, timeout: float | None) -> SlurmJob | None:
        from ..supervision.interrupts import DeferredInterrupt

        command = self.command()
        self.note(f"asking Slurm for an allocation: {' '.join(['salloc', *command[1:-4]])}")
        self.process = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                        stderr=subprocess.PIPE, env=slurm_env(), start_new_session=True)
        deadline = None if timeout is None else time.monotonic() + timeout
        selector = selectors.DefaultSelector()
        wake_read, wake_write = os.pipe()
        os.set_blocking(wake_read, False)
        selector.register(wake_read, selectors.EVENT_READ, "wake")
        for pipe, name in ((self.process.stdout, "stdout"), (self.process.stderr, "stderr")):
            os.set_blocking(pipe.fileno(), False)
            selector.register(pipe, selectors.EVENT_READ, name)
        partial = {"stdout": b"", "stderr": b""}
        next_poll = time.monotonic()
        try:
            with DeferredInterrupt(wake_write) as interrupt:
                while True:
                    if interrupt.count:
                        return self._give_up("interrupted")
                    if deadline is not None and time.monotonic() > deadline:
                        return self._give_up("timeout")
                    for key, _ in selector.select(0.25):
                        if key.data == "wake":
                            with contextlib.suppress(BlockingIOError):
                                os.read(wake_read, 512)
                            continue
                        chunk = os.read(key.fd, 65536)
                        if not chunk:
                            selector.unregister(key.fileobj)
                            continue
                        *lines, partial[key.data] = (partial[key.data] + chunk).split(b"\n")
                        for line in lines:
                            job = self._line(key.data, line.decode("utf-8", "replace").strip())
                            if job is not None:
                                return job
                    if self.process.poll() is not None and not selector.get_map().keys() - {wake_read}:
                        self._refused()
                    if self.job_id and time.monotonic() >= next_poll:
                        next_poll = time.monotonic() + POLL_S
                        self._poll_reason()
                    self.on_tick()
        finally:
            selector.close()
            os.close(wake_read)
            os.close(wake_write)

    def _line(self, stream: str, line: str) -> SlurmJob | None:
        if not line:
            return None
        if stream == "stdout":
            words = line.split()
            if len(words) == 4 and words[0] == _MARK:
                self.granted = True
                try:
                    job = job_from_fields(words[1], words[2], words[3])
                except SlurmError as exc:
                    self.release()
                    raise LaunchArgumentError(f"Slurm job {self.job_id or words[1]!r} was granted, but it cannot be "
                                              f"used ({exc}); it was given back") from None
                self.job_id = job.job_id
                self.note(f"Slurm job {job.job_id} granted: {', '.join(job.hosts)}")
                return job
            return None
        self.said.append(line)
        match = _JOB_ID.search(line)
        if match and self.job_id is None:
            self.job_id = match.group(1)
            if "Pending" in line:
                self.reason = "queued"
                self.note(f"Slurm job {self.job_id} is pending: waiting for its allocation (an interrupt or "
                          f"timeout= cancels it: scancel {self.job_id})")
        return None

    def _poll_reason(self) -> None:
        try:
            text = run_slurm(["squeue", "-h", f"--jobs={checked_id(self.job_id)}", "-o", "%T|%r"],
                             timeout=15).strip()
        except SlurmError:
            return
        state, _, reason = text.partition("|")
        if state == "PENDING" and reason not in ("", "None", self.reason):  # (None: about to start)
            self.reason = reason
            self.note(f"Slurm job {self.job_id} is pending ({reason}): waiting for its allocation (an interrupt or "
                      f"timeout= cancels it: scancel {self.job_id})")

    def _refused(self) -> None:
        """salloc ended without running the holder: Slurm refused the job, it was cancelled from outside, or an
        option stopped salloc from running it (``--no-shell``). A job it was granted is cancelled."""
        errors = [line.removeprefix("salloc: ") for line in self.said if "error" in line or "unrecognized" in line
                  or "invalid" in line.lower()] or [line.removeprefix("salloc: ") for line in self.said[-3:]]
        said = "; ".join(errors) or f"salloc exited with code {self.process.returncode}"
        self.release()
        if self.job_id is not None and any("Granted job allocation" in line for line in self.said):
            raise LaunchArgumentError(f"slurm_options={self.asked!r}: salloc was granted job {self.job_id} but ended "
                                      f"without running the launch on it (salloc {' '.join(self.options)}: {said}); "
                                      f"the job was cancelled. Leave out the options that change what salloc runs "
                                      f"(--no-shell): the launch needs salloc to hold the job while it runs")
        raise LaunchArgumentError(f"slurm_options={self.asked!r}: Slurm refused the allocation (salloc "
                                  f"{' '.join(self.options)}): {said}. Fix the option it names (`salloc --help` "
                                  f"lists them; `sinfo` shows the partitions)")

    def _give_up(self, why: str) -> None:
        self.ended = why
        state = f"job {self.job_id}" if self.job_id else "the request"
        self.note(f"{'interrupted' if why == 'interrupted' else 'timeout'} while waiting for Slurm: {state} "
                  f"cancelled")
        self.release()
        return None

    def release(self) -> None:
        """Give the allocation back: the holder's stdin closed (salloc relinquishes the job), then a cancel for
        whatever did not go in time. Safe to call more than once; an interrupt meanwhile is raised after it."""
        from ..supervision.interrupts import DeferredInterrupt

        wake_read, wake_write = os.pipe()
        try:
            with DeferredInterrupt(wake_write) as interrupt:
                self._release()
        finally:
            os.close(wake_read)
            os.close(wake_write)
        if interrupt.count:
            raise KeyboardInterrupt

    def _release(self) -> None:
        """Given back by the holder's end when it ran; otherwise a job whose id is known is cancelled, whatever
        salloc did meanwhile (each step bounded: RELEASE_S, and run_slurm's timeout)."""
        process = self.process
        if process is None or self._released:
            return
        self._released = True
        given_back = False
        if self.granted and process.poll() is None:
            with contextlib.suppress(OSError):
                process.stdin.close()
            with contextlib.suppress(subprocess.TimeoutExpired):
                process.wait(timeout=RELEASE_S)
            given_back = process.poll() is not None
        if not given_back:
            self.cancel()
        self._reap()

    def cancel(self) -> None:
        """scancel the job (salloc then ends); before salloc said its id, SIGTERM to salloc, which withdraws its
        request (a SIGKILL would leave the request queued)."""
        process = self.process
        if self.job_id is not None:
            with contextlib.suppress(SlurmError):
                scancel(self.job_id)
        elif process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(process.pid, signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            process.wait(timeout=RELEASE_S)

    def _reap(self) -> None:
        process = self.process
        if process is None:
            return
        if process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
        process.wait()
        for pipe in (process.stdin, process.stdout, process.stderr):
            with contextlib.suppress(OSError, ValueError):
                pipe.close()
