"""The doctor's Slurm checks: the job this kernel runs in and whether srun works from here."""

from __future__ import annotations

import os
import shutil

from .remote import OK, PROBLEM, WARNING, Check
from .slurm_job import SlurmError, gpus_per_node, job_from_env, run_slurm


def slurm_checks() -> list[Check]:
    """The doctor's Slurm context: the job this kernel runs in (nodes, tasks, CPUs and GPUs per node) and whether
    srun works from here. Nothing when neither Slurm's commands nor a job are here."""
    job_id = os.environ.get("SLURM_JOB_ID")
    if not shutil.which("srun"):
        return [Check("Slurm", WARNING, f"in job {job_id}, but srun is not on PATH",
                      "add Slurm's commands to PATH for start_hosts_with='srun'")] if job_id else []
    if not job_id:
        try:
            said = run_slurm(["srun", "--test-only", "-N1", "true"]) or "srun --test-only answered"
        except SlurmError as exc:
            return [Check("Slurm", WARNING, f"not in a job, and `srun --test-only -N1 true` fails: {exc}",
                          "check the Slurm configuration (SLURM_CONF) and that slurmctld is up")]
        return [Check("Slurm", OK, f"not in a job; srun works from here ({said.strip()})",
                      "start_hosts_with='srun' with slurm_options=[...] asks for an allocation")]
    try:
        job = job_from_env()
        gpus = gpus_per_node(job.job_id)
    except SlurmError as exc:
        return [Check("Slurm job", PROBLEM, f"job {job_id!r}: {exc}", "check SLURM_JOB_ID and SLURM_JOB_NODELIST, and "
                      "that slurmctld is reachable from here")]
    per_node = ", ".join(f"{host}: {job.cpus.get(host, '?')} CPUs, {gpus.get(host, 0)} GPUs" for host in job.hosts)
    tasks = os.environ.get("SLURM_NTASKS", "?")
    checks = [Check("Slurm job", OK, f"job {job.job_id}: {len(job.hosts)} node(s), {tasks} task(s); {per_node}")]
    command = ["srun", f"--jobid={job.job_id}", "--overlap", "-N", str(len(job.hosts)), "-n", str(len(job.hosts)),
               "--ntasks-per-node=1", "printenv", "SLURMD_NODENAME"]
    try:
        names = run_slurm(command, timeout=60).split()
    except SlurmError as exc:
        checks.append(Check("srun from here", PROBLEM, f"`{' '.join(command)}`: {exc}",
                            "ask the admins whether steps may overlap (--overlap) and srun runs from this node"))
    else:
        checks.append(Check("srun from here", OK, f"a step ran on {', '.join(names)}"))
    return checks
