"""Ranks on this machine: one forked or spawned worker per rank, supervised by this kernel (for XLA one
process, torch_xla's host of every ordinal: see ``xla_host``).

On several nodes each node's kernel runs this launcher for its own ranks; with ``rdzv_backend="c10d"`` the
nodes first meet at torch's rendezvous, which gives each its node rank and node 0's store address.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os

from ..cluster.ports import reserve_port
from ..cluster.rendezvous import NodeRendezvous, NodeRendezvousTimeout
from ..display import Display
from ..errors import LaunchTimeoutError, RankFailedError
from ..plan import LaunchPlan
from ..rank.torch_names import missing as missing_private_names
from ..schema.results import prepare as prepare_results
from ..schema.status import StopReason
from ..supervision.failure import failure_message, hang_message, root_cause, user_stacks
from ..supervision.supervisor import Supervisor, SupervisorOutcome
from ..xla_devices import import_xla_multiprocessing
from .base import Launcher
from .intake import EventIntake
from .outcome import LaunchOutcome
from .restarts import RestartPolicy


class LocalLauncher(Launcher):
    """``launch()`` runs every attempt of a launch on this machine and returns how the last one ended."""

    def __init__(self, payload: bytes = b""):
        self.payload = payload  # (function, args) pickled, for spawned workers; b"" under fork
        self._in_memory = -1  # the payload's in-memory file, where the runs folder could not hold it

    def launch(self, plan: LaunchPlan, display: Display, intake: EventIntake,
               policy: RestartPolicy) -> LaunchOutcome:
        __tracebackhide__ = True  # IPython shows the error, not the launcher's frames (the run log has them)
        try:
            return self._launch(plan, display, intake, policy)
        finally:
            if self._in_memory >= 0:
                os.close(self._in_memory)
                self._in_memory = -1

    def _launch(self, plan: LaunchPlan, display: Display, intake: EventIntake,
                policy: RestartPolicy) -> LaunchOutcome:
        __tracebackhide__ = True
        if plan.start_method == "fork":  # imported once here, not in every forked worker
            import torch.distributed  # noqa: F401 (~1 s each)

            if plan.xla is not None:
                import_xla_multiprocessing()  # (~7 s; it does not start the XLA runtime)

            prepare_results()
        payload_path = self._write_payload(intake.log) if self.payload else ""
        meeting_point = None
        if plan.num_nodes > 1 and plan.rdzv_backend == "c10d":
            meeting_point = NodeRendezvous.for_launch(f"{plan.master_addr}:{plan.requested_port}", plan.rdzv_id,
                                                      plan.num_nodes, plan.timeout, plan.rdzv_conf)
        while True:
            try:
                plan, reservation = self._place(plan, display, meeting_point)
            except LaunchTimeoutError as error:  # a node never came to the c10d rendezvous
                return LaunchOutcome.stopped(StopReason.TIMEOUT, error)
            if intake.attempts == 0:
                display.note(plan.describe())
                for lost in missing_private_names():  # a hook of ours this torch cannot take: say so, once
                    display.note(f"warning: this torch lacks {lost}")
            intake.begin(plan.global_rank(local) for local in range(plan.num_processes))
            supervisor = Supervisor(plan, intake.on_event, payload_path, on_tick=intake.tick,
                                    store_listen_fd=reservation.fileno() if reservation else -1,
                                    progress_dir=intake.run_dir)
            try:  # once started, rank 0 has its own copy of the listening socket; run() ends every worker itself
                outcome = supervisor.run(plan.timeout, on_started=reservation.close if reservation else None)
            finally:
                if reservation is not None:
                    reservation.close()
                intake.end()
            if outcome.stop_reason in (StopReason.HANG, StopReason.TIMEOUT):
                return _hang_outcome(plan, intake, outcome)
            failures = intake.tracker.failures()
            if not failures and outcome.stop_reason is None:
                return intake.finished()
            again = policy.next_plan(plan, failures, "all ranks")
            if again is None:
                cause = root_cause(failures)
                message = failure_message(cause, failures, intake.tracker, outcome.ranks, intake.run_dir)
                return LaunchOutcome.stopped(StopReason.FAILURE, RankFailedError(message, cause, failures),
                                             failures=failures)
            plan = again

    def _write_payload(self, log) -> str:
        """Where spawned workers load (function, args) from: a private file in the run's folder, removed when the
        launch ends; in memory where that folder's disk cannot hold it (full, failing: the run goes on)."""
        path = log.file("payload.pkl")
        try:
            descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(descriptor, "wb") as out:
                out.write(self.payload)
            return path
        except OSError:
            with contextlib.suppress(OSError):
                os.remove(path)
        self._in_memory = descriptor = os.memfd_create("payload.pkl")  # a worker opens it by /proc
        with open(descriptor, "wb", closefd=False) as out:
            out.write(self.payload)
        return f"/proc/{os.getpid()}/fd/{descriptor}"

    @staticmethod
    def _place(plan: LaunchPlan, display: Display, meeting_point):
        """Where this attempt's ranks meet: c10d's answer across nodes, else the port reserved here."""
        if meeting_point is not None:  # c10d: the nodes meet; node 0 tells the others where the store is
            meeting = _meet(meeting_point, plan)
            plan = dataclasses.replace(plan, node_rank=meeting.node_rank, master_addr=meeting.master_addr,
                                       master_port=meeting.master_port)
            display.retarget(plan.node_rank, [plan.global_rank(local) for local in range(plan.num_processes)])
            return plan, meeting.reservation
        reservation = None  # (XLA ordinals meet through torch_xla's runtime, not a store of ours)
        if plan.num_nodes == 1 and plan.xla is None:
            reservation = reserve_port(plan.master_addr, plan.requested_port)
        if reservation is not None:
            plan = dataclasses.replace(plan, master_port=reservation.port, port_note=reservation.note)
        return plan, reservation


def _hang_outcome(plan: LaunchPlan, intake: EventIntake, outcome: SupervisorOutcome) -> LaunchOutcome:
    """A hang or the timeout: where every rank was and its stacks, in the message and the outcome."""
    tracker = intake.tracker
    message = hang_message(outcome.snapshot, tracker, outcome.stack_dump_seq, plan.timeout, intake.run_dir,
                           outcome.stop_reason == StopReason.TIMEOUT)
    if all(tracker.state(rank) == "starting" for rank in outcome.ranks):
        message = _rendezvous_note(plan) + "\n\n" + message
    stuck = sorted(rank for rank, info in outcome.snapshot.items() if info.get("state") == "running")
    return LaunchOutcome.stopped(outcome.stop_reason, LaunchTimeoutError(message), stuck_ranks=stuck,
                                 stacks=user_stacks(tracker, outcome.stack_dump_seq))


def _meet(meeting_point: NodeRendezvous, plan: LaunchPlan):
    try:
        return meeting_point.meet()
    except NodeRendezvousTimeout as exc:
        meeting_point.forget()
        raise LaunchTimeoutError(
            f"This node waited at the c10d rendezvous {meeting_point.endpoint} (rdzv_id={plan.rdzv_id!r}) for "
            f"all {plan.num_nodes} nodes and not all arrived within {meeting_point.join_timeout:g} s: a node never "
            f"joined. Start the same launch on every node with the same num_nodes, rdzv_endpoint and rdzv_id, "
            f"and check that {meeting_point.endpoint} is reachable from every node. (torch: {exc})") from None


def _rendezvous_note(plan: LaunchPlan) -> str:
    """No rank got past joining the process group: on several nodes, a node that never arrived."""
    where = f"{plan.master_addr}:{plan.master_port}"
    if plan.num_nodes > 1:
        return (f"The ranks of node {plan.node_rank} waited at the rendezvous ({where}) for all {plan.world_size} "
                f"ranks and not all arrived within timeout={plan.timeout:g} s: a node never joined. Start the "
                f"same launch on every node, each with its own node_rank (0..{plan.num_nodes - 1}), the same "
                f"num_nodes, master_addr and use_port, and check that {where} is reachable from every node.")
    return (f"No rank finished joining the process group ({where}) within timeout={plan.timeout:g} s; see where "
            f"each one was below.")
