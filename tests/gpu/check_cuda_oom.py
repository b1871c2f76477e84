"""GPU check (run by hand on a machine with CUDA GPUs): a real CUDA out-of-memory error, retried smaller.

    python tests/gpu/check_cuda_oom.py

Each try allocates ``batch_size`` x (a quarter of the first GPU's memory), so 8 and 4 cannot fit and 2 can (with
what the CUDA context takes). In one process it must print the retries and succeed at 2; then the same on every
GPU through notebook_launcher (one rank per GPU), where all ranks restart together at the agreed size (with one
GPU the one process runs in the kernel and retries by itself). Exits 0 on
success, 1 on failure, 0 with a note when there is no CUDA GPU.
"""

import sys

import torch

from notebook_launcher import find_executable_batch_size, last_run, notebook_launcher


def quarter_of_the_gpu() -> int:
    return torch.cuda.get_device_properties(torch.cuda.current_device()).total_memory // 4


def train():
    quarter = quarter_of_the_gpu()

    @find_executable_batch_size(starting_batch_size=8)
    def inner(batch_size):
        activations = torch.empty(batch_size * quarter, dtype=torch.uint8, device="cuda")
        return batch_size, int(activations.numel())

    return inner()


def main() -> int:
    if not torch.cuda.is_available():
        print("no CUDA GPU here: nothing to check")
        return 0
    size, _ = train()  # in this process
    print(f"one process: finished at batch size {size}")
    if size != 2:
        return 1
    gpus = torch.cuda.device_count()
    result = notebook_launcher(train, num_processes=gpus, device="cuda", start_method="spawn")
    retries = [(r["batch_size"], r["new_batch_size"], r["ranks"]) for r in last_run().oom_retries]
    print(f"{gpus} GPU rank(s): finished at batch size {result[0]}, retries {retries}")
    # One GPU: one process, run in the kernel, where find_executable_batch_size retries by itself; several: every
    # rank restarts together at the agreed size, twice (8 -> 4 -> 2).
    expected_restarts = 2 if gpus > 1 else 0
    return 0 if result[0] == 2 and len(retries) == expected_restarts else 1


if __name__ == "__main__":
    sys.exit(main())
