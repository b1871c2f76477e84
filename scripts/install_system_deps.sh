#!/usr/bin/env bash
# Debian packages the tests use for real: Open MPI (the doctor's mpirun sanity run), OpenSSH (its SSH check
# against a local sshd), Chromium (the browser tests of the JupyterLab panel, driven by Playwright) and Slurm
# with munge (the start_hosts_with="srun" / slurm_options tests, against a two-node Slurm the tests start).
# Installs only what is missing; needs root (as on CI).
set -euo pipefail
need=()
command -v mpirun >/dev/null 2>&1 || need+=(openmpi-bin)
[ -x /usr/sbin/sshd ] || need+=(openssh-server)
command -v ssh >/dev/null 2>&1 || need+=(openssh-client)
command -v ssh-keygen >/dev/null 2>&1 || need+=(openssh-client)
[ -x /usr/bin/chromium ] || need+=(chromium)
command -v munged >/dev/null 2>&1 || [ -x /usr/sbin/munged ] || need+=(munge)
{ command -v slurmctld && command -v slurmd && command -v srun; } >/dev/null 2>&1 || need+=(slurm-wlm)
if [ ${#need[@]} -gt 0 ]; then
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
fi
