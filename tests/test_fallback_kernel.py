"""The fallback in a real Jupyter kernel with nothing listening on the panel's comm (what Colab, Kaggle and VS Code
get): its clock moves while nothing happens. A hang (rank 1 skips an all_reduce) is a long quiet stretch; the
output must still be updated every ~2 s, with the headline's seconds and the hang card's moving."""

from __future__ import annotations

import json
import os

import pytest
from helpers.cells import hang_cell
from helpers.kernel import PANEL_MIME, _messages, running_kernel

pytestmark = pytest.mark.kernel

HANG_CELL = hang_cell(warm_up=2, hang_warning=3, timeout=18)


@pytest.mark.slow
def test_the_fallback_moves_every_two_seconds_through_a_quiet_hang(tmp_path, runs_dir):
    env = {**os.environ, "NOTEBOOK_LAUNCHER_RUNS_DIR": str(runs_dir)}
    with running_kernel(tmp_path, env) as (km, kc, kernel):
        msg_id = kc.execute(HANG_CELL)
        updates = []
        for msg in _messages(kc.get_iopub_msg, msg_id, 120, "the kernel did not go idle"):
            if msg["msg_type"] == "status" and msg["content"]["execution_state"] == "idle":
                break
            if msg["msg_type"] == "update_display_data":
                updates.append(msg["content"]["data"])
    states = [update[PANEL_MIME] for update in updates]
    assert states[-1]["status"] == "timed out"
    running = [(state["elapsed"], state, update) for state, update in zip(states, updates)
               if state["status"] == "running"]
    # the quiet stretch: from the hang notice (3 s without progress) to the timeout, no event but the notice
    quiet = [item for item in running if 5.0 <= item[0] <= 15.0]
    assert len(quiet) >= 4, [round(item[0], 1) for item in running]  # every ~2 s: 5 in 10 s (4: generous)
    times = [item[0] for item in quiet]
    assert times == sorted(times) and len(set(times)) == len(times)  # each one a later clock
    hang_seconds = [int(item[1]["summary"]["title"].split()[2]) for item in quiet
                    if item[1]["summary"]["verdict"] == "hang"]
    assert len(hang_seconds) >= 3 and hang_seconds == sorted(hang_seconds) and hang_seconds[-1] > hang_seconds[0]
    for _, _, update in quiet[-2:]:  # the card with its verdict is the first thing the fallback shows
        assert update["text/plain"].startswith("Possible hang: ")
        assert update["text/html"].index('data-verdict="hang"') < update["text/html"].index("rank  status")
    sizes = [len(json.dumps(update)) for _, _, update in quiet]
    assert max(sizes) < 64_000  # a small run's tick is a few KB (FALLBACK_LIVE_BYTES bounds any)
