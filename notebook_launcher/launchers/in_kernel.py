"""One process on one node: the function runs in the kernel itself (no fork, no pickling, a debugger works)."""

from __future__ import annotations

import os

from ..display import Display
from ..plan import LaunchPlan
from .base import Launcher
from .intake import EventIntake
from .outcome import LaunchOutcome
from .restarts import RestartPolicy


class InKernelLauncher(Launcher):
    """A one-process default group (so DDP code runs unchanged) and the Accelerate variables, both put back as
    they were afterwards. ``timeout`` does not apply here; the function's own error is raised as it is."""

    def launch(self, plan: LaunchPlan, display: Display, intake: EventIntake,
               policy: RestartPolicy) -> LaunchOutcome:
        __tracebackhide__ = True  # IPython shows the error, not the launcher's frames (the run log has them)
        import torch.distributed as dist

        display.note(f"1 process: running {_name(plan.function)} in this kernel on {plan.device}")
        env = {"ACCELERATE_MIXED_PRECISION": plan.mixed_precision, "RANK": "0", "LOCAL_RANK": "0",
               "WORLD_SIZE": "1", "LOCAL_WORLD_SIZE": "1"}
        if plan.device == "cpu":
            env["ACCELERATE_USE_CPU"] = "true"
        saved = {key: os.environ.get(key) for key in env}
        own_group = dist.is_available() and not dist.is_initialized() and plan.device in ("cpu", "cuda")
        intake.started()
        os.environ.update(env)
        try:
            if own_group:
                dist.init_process_group(plan.backend, store=dist.HashStore(), rank=0, world_size=1)
            result = plan.function(*plan.args)
        finally:
            if own_group and dist.is_initialized():
                dist.destroy_process_group()
            for key, value in saved.items():
                if value is None:
                    os.environ.pop(key, None)
                else:
                    os.environ[key] = value
        intake.keep_result(0, result)
        return LaunchOutcome.finished(result)


def _name(function) -> str:
    return getattr(function, "__qualname__", type(function).__name__)
