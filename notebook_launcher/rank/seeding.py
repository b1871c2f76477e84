"""``set_seed``: the same random numbers on every run, for a launched function to call on each rank."""

from __future__ import annotations

import os


def set_seed(seed: int, deterministic: bool = False) -> None:
    """Seed Python's random, numpy and torch (every device) in this process; call it inside the launched
    function so every rank is seeded. ``deterministic`` also asks torch for deterministic algorithms."""
    import random

    import torch

    random.seed(seed)
    try:
        import numpy

        numpy.random.seed(seed)
    except ImportError:
        pass
    torch.manual_seed(seed)
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.manual_seed_all(seed)
    if deterministic:
        torch.use_deterministic_algorithms(True)
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
