"""TPU cores through torch_xla's ``xmp.spawn``: torch_xla starts and joins the processes itself."""

from __future__ import annotations

import os
from typing import Any

from ..plan import import_xla_multiprocessing
from ..runs import Run


class XlaLauncher:
    """Rank 0's result comes back through a file in the run's folder (``xmp.spawn`` returns nothing)."""

    def launch(self, plan, run: Run, display, attempts) -> Any:
        import cloudpickle

        from ..worker import XlaEntry

        display.note(plan.describe())
        xmp = import_xla_multiprocessing()
        result_path = attempts.log.file("xla_result.pkl")
        run.status = "running"
        xmp.spawn(XlaEntry(plan.function, result_path), args=plan.args, nprocs=plan.num_processes,
                  start_method=plan.start_method)
        if os.path.exists(result_path):
            with open(result_path, "rb") as saved:
                run.results[0] = cloudpickle.load(saved)
            os.remove(result_path)
        run.status = "finished"
        return run.result(0)
