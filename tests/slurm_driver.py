"""A notebook's kernel for tests/test_slurm.py. Run under ``salloc``: inside a Slurm allocation, it prints one
line, ``RESULT {json}``, with what the launches gave (with ``once``: the first launch only; with ``shared``: one
launch of 2 ranks per node, its result and what the launch said). With ``sleep``: from outside a job, ranks that
sleep on an allocation asked for with slurm_options (the test kills this process meanwhile)."""

from __future__ import annotations

import contextlib
import io
import json
import os
import sys


def where_am_i():
    import torch
    import torch.distributed as dist

    value = torch.tensor([float(dist.get_rank() + 1)])
    dist.all_reduce(value)  # 1 + 2 + 3 + 4 over the group of 4
    return {"node": os.environ.get("SLURMD_NODENAME"), "sum": value.item(), "world": dist.get_world_size()}


def sleeps():
    import time

    print(f"sleeping on {os.environ.get('SLURMD_NODENAME')}", flush=True)
    time.sleep(300)


def main() -> dict:
    from notebook_launcher import notebook_launcher
    from notebook_launcher.cluster.slurm_checks import slurm_checks
    from notebook_launcher.runs import last_run

    out = {"job": os.environ.get("SLURM_JOB_ID")}
    if sys.argv[1:] == ["shared"]:
        said = io.StringIO()
        with contextlib.redirect_stdout(said):
            out["rank0"] = notebook_launcher(where_am_i, num_processes=2, start_hosts_with="srun", display="text",
                                             timeout=240)
        out["said"] = said.getvalue()
        return out
    out["rank0"] = notebook_launcher(where_am_i, num_processes=2, start_hosts_with="srun", results="all",
                                     display="text", timeout=240)
    out["ranks"] = {str(rank): value["node"] for rank, value in last_run().results.items()}
    if sys.argv[1:] == ["once"]:
        return out
    out["narrowed"] = notebook_launcher(where_am_i, num_processes=2, start_hosts_with="srun", hosts=["n2"],
                                        display="text", timeout=240)
    out["doctor"] = [[check.name, check.verdict, check.found] for check in slurm_checks()]
    return out


if __name__ == "__main__":
    if sys.argv[1:] == ["sleep"]:
        from notebook_launcher import notebook_launcher

        notebook_launcher(sleeps, num_processes=2, start_hosts_with="srun", slurm_options=["--nodes=2"],
                          display="text", timeout=300)
    print("RESULT " + json.dumps(main()), flush=True)
    sys.stdout.flush()
