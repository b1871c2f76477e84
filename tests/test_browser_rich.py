"""What a user sees of a rank's rich output, and of the kernel, in a real JupyterLab in Debian's Chromium (Playwright).

- Transformers' ``Trainer`` (its default notebook callback) run by ``notebook_launcher`` on 2 CPU ranks: the
  progress bar and "Training Loss" table are in the cell while the run goes on, one output, updated in place.
- The kernel indicators (the status bar's "Python 3 (ipykernel) | Busy" and the notebook toolbar's execution
  indicator), watched in the page for every change during a 10 s launch whose panel listens over its comm: never
  idle while the cell runs, idle once it is done.
- Rank 0's ``%matplotlib inline`` figure: an image in the cell, saved in the .ipynb, shown again after a reload.

Screenshots go to tests/output/ (trainer-table-live.png, kernel-busy-mid-run.png, figure-after-reload.png).
"""

from __future__ import annotations

import base64
import json

import nbformat
import pytest
from helpers.browser import _notebook, command, open_notebook, screenshot

pytestmark = pytest.mark.slow

CELL = ".jp-Notebook .jp-CodeCell"

# JS: the first code cell, whether it runs ('[*]:' is its prompt until the kernel's reply and idle arrive), and
# whether its run panel (the extension's) says the launch is running.
CELL_STATE_JS = f"""
const cell = document.querySelector('{CELL}');
const running = cell.querySelector('.jp-InputPrompt').textContent.includes('*');
const panel = cell.querySelector('.nl-run');
const launchRunning = !!panel && panel.dataset.status === 'running';
"""

TRAINER_CELL = '''\
import os
os.environ["HF_HUB_OFFLINE"] = "1"  # nothing is downloaded: the model is built from a config
import time
import torch
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainerCallback, TrainingArguments
from notebook_launcher import notebook_launcher

class Pace(TrainerCallback):
    """A step takes 0.5 s at least, so the run lasts long enough to be watched."""
    def on_step_end(self, args, state, control, **kwargs):
        time.sleep(0.5)

def train(output_dir):
    torch.manual_seed(0)
    config = GPT2Config(n_layer=1, n_head=2, n_embd=32, vocab_size=64, n_positions=32, bos_token_id=0,
                        eos_token_id=0)
    model = GPT2LMHeadModel(config)

    class RandomTokens(torch.utils.data.Dataset):
        ids = torch.randint(0, 64, (96, 16), generator=torch.Generator().manual_seed(1))

        def __len__(self):
            return 96

        def __getitem__(self, index):
            return {"input_ids": self.ids[index], "labels": self.ids[index]}

    args = TrainingArguments(output_dir=output_dir, per_device_train_batch_size=4, num_train_epochs=1,
                             report_to=[], save_strategy="no", use_cpu=True, logging_steps=1)
    trainer = Trainer(model=model, args=args, train_dataset=RandomTokens(), callbacks=[Pace()])
    return trainer.train().global_step

steps = notebook_launcher(train, args=("trainer",), num_processes=2, device="cpu")
'''
TRAINER_STEPS = 12  # 96 samples, 2 ranks of 4 a step

# JS: the cell's outputs that hold the notebook callback's table, and the newest one's text and progress value.
TABLE_JS = CELL_STATE_JS + """
const tables = Array.from(cell.querySelectorAll('.jp-OutputArea-output'))
    .filter(output => output.querySelector('progress') && output.innerText.includes('Training Loss'));
const table = tables[tables.length - 1];  // the newest: with one table, the table
const sample = table && {text: table.innerText, count: tables.length, visible: table.checkVisibility(),
                         value: Number(table.querySelector('progress').getAttribute('value')),
                         rows: table.querySelectorAll('tbody tr').length, running, launchRunning};
"""


def _assert_one_table_shown(sample: dict) -> None:
    assert sample["count"] == 1, sample  # one output, updated in place, never a second table
    assert sample["visible"], sample
    assert "Step" in sample["text"] and "Training Loss" in sample["text"], sample
    assert f"/{TRAINER_STEPS} " in sample["text"], sample  # the bar's "[ 3/12 00:01 < 00:04, ...]"


def test_trainers_progress_table_is_live_in_the_cell_and_updates_in_place(lab):
    pytest.importorskip("transformers")
    root, url, browser = lab
    _notebook(root / "trainer.ipynb", [TRAINER_CELL, "print('steps', steps)"])
    page = open_notebook(browser, url, "trainer.ipynb")
    command(page, "notebook:run-all-cells", wait=False)

    # each sample is read in one go in the page: the table as shown, and that the cell and the launch still run
    first = page.wait_for_function(
        f"() => {{ {TABLE_JS} return sample && sample.running && sample.launchRunning && sample.rows >= 1 && sample; }}",
        timeout=180_000, polling=100).json_value()
    _assert_one_table_shown(first)
    page.locator(f"{CELL} .jp-OutputArea-output:has(progress)").first.scroll_into_view_if_needed()
    screenshot(page, "trainer-table-live.png")
    second = page.wait_for_function(
        f"""() => {{ {TABLE_JS} return sample && sample.running && sample.launchRunning
                                       && sample.text !== {json.dumps(first['text'])} && sample; }}""",
        timeout=120_000, polling=100).json_value()
    _assert_one_table_shown(second)
    assert (second["value"], second["rows"]) > (first["value"], first["rows"]), (first, second)  # a later step

    # the end: still that one output, at the last step, a row per step; the next cell sees the return value
    page.wait_for_function(f"() => {{ {CELL_STATE_JS} return !running && panel && panel.dataset.status === 'finished'; }}",
                           timeout=180_000)
    final = page.evaluate(f"() => {{ {TABLE_JS} return sample; }}")
    assert final["count"] == 1 and final["value"] == TRAINER_STEPS and final["rows"] == TRAINER_STEPS, final
    assert f"{TRAINER_STEPS}/{TRAINER_STEPS}" in final["text"], final
    page.wait_for_function("""() => Array.from(document.querySelectorAll('.jp-Notebook .jp-CodeCell'))[1]
                                      .querySelector('.jp-OutputArea').textContent.includes('steps ')""",
                           timeout=60_000)
    assert f"steps {TRAINER_STEPS}" in page.locator(CELL).nth(1).locator(".jp-OutputArea").inner_text()


TEN_SECONDS_CELL = '''\
import time
from notebook_launcher import notebook_launcher

def tick(seconds):
    import torch.distributed as dist
    for i in range(2 * seconds):
        print(f"rank {dist.get_rank()} tick {i}", flush=True)
        time.sleep(0.5)
    return dist.get_rank()

notebook_launcher(tick, args=(10,), num_processes=2, device="cpu")
print("LAUNCH RETURNED")
time.sleep(2)  # the kernel stays busy a while after this line shows: the window checked ends well before idle
'''

# JS: records what both kernel indicators read, at every change of the status bar or the notebook's toolbar
# (a MutationObserver) and every 50 ms, with the cell's own state, into window.nlSamples; with each sample, how many
# messages of the panel's comm the page sent and received so far and how many `idle` statuses the kernel published.
RECORD_INDICATORS_JS = f"""() => {{
    const samples = window.nlSamples = [];
    const seen = {{commSent: 0, commReceived: 0, idleStatuses: 0}};
    const kernel = window.jupyterapp.shell.currentWidget.sessionContext.session.kernel;
    kernel.anyMessage.connect((_, {{msg, direction}}) => {{
        if (msg.header.msg_type === 'comm_msg' && (msg.content.comm_id || '').startsWith('notebook_launcher.panel.')) {{
            seen[direction === 'send' ? 'commSent' : 'commReceived'] += 1;
        }} else if (msg.header.msg_type === 'status' && msg.content.execution_state === 'idle') {{
            seen.idleStatuses += 1;
        }}
    }});
    const statusBar = document.querySelector('#jp-main-statusbar');
    const toolbar = document.querySelector('.jp-NotebookPanel-toolbar');
    const read = (why) => {{
        {CELL_STATE_JS}
        const kernelItem = Array.from(statusBar.querySelectorAll('.jp-StatusBar-TextItem'))
            .find(item => (item.title || '').startsWith('Change kernel for'));
        const indicator = toolbar.querySelector('.jp-Notebook-ExecutionIndicator');
        samples.push({{t: performance.now(), why, running, launchRunning, panel: !!panel, ...seen,
                       statusBar: kernelItem ? kernelItem.textContent : null,
                       toolbar: indicator ? indicator.dataset.status : null,
                       returned: cell.querySelector('.jp-OutputArea').textContent.includes('LAUNCH RETURNED')}});
    }};
    const observer = new MutationObserver(() => read('change'));
    for (const node of [statusBar, toolbar]) {{
        observer.observe(node, {{subtree: true, childList: true, characterData: true, attributes: true}});
    }}
    window.nlStopSampling = () => {{ observer.disconnect(); clearInterval(timer); }};
    const timer = setInterval(() => read('timer'), 50);
    read('start');
}}"""


def test_the_kernel_indicator_reads_busy_through_a_launch_and_idle_after(lab):
    root, url, browser = lab
    _notebook(root / "busy.ipynb", [TEN_SECONDS_CELL])
    page = open_notebook(browser, url, "busy.ipynb")
    page.evaluate(RECORD_INDICATORS_JS)
    command(page, "notebook:run-all-cells", wait=False)

    page.wait_for_selector(f'{CELL} .nl-run[data-status="running"] .nl-rank[data-rank="1"] .nl-line', timeout=120_000)
    screenshot(page, "kernel-busy-mid-run.png")
    page.wait_for_function("() => window.nlSamples.some(sample => sample.returned)", timeout=120_000)
    page.wait_for_function(f"() => {{ {CELL_STATE_JS} return !running; }}", timeout=60_000)
    idle_bar = '#jp-main-statusbar .jp-StatusBar-TextItem[title^="Change kernel for"]'
    page.wait_for_function(f"""() => document.querySelector('{idle_bar}').textContent.endsWith('| Idle')
                                     && document.querySelector('.jp-NotebookPanel-toolbar .jp-Notebook-ExecutionIndicator')
                                        .dataset.status === 'idle'""", timeout=60_000)
    page.wait_for_timeout(500)  # a few samples of the idle kernel after the cell
    samples = page.evaluate("() => { window.nlStopSampling(); return window.nlSamples; }")

    # the window: from the run's panel in the cell to the line printed after the launch returned (2 s before the
    # kernel's idle), all of it while the cell's prompt is [*]
    start = next(i for i, sample in enumerate(samples) if sample["panel"])
    end = next(i for i, sample in enumerate(samples) if sample["returned"])
    during = samples[start:end]
    span_s = (samples[end]["t"] - samples[start]["t"]) / 1000
    assert span_s > 5 and len(during) > 50, (span_s, len(during))  # the 10 s launch, watched all along
    assert all(sample["running"] for sample in during)
    not_busy = [sample for sample in during
                if not (sample["statusBar"] or "").endswith("| Busy") or sample["toolbar"] != "busy"]
    assert not not_busy, (f"{len(not_busy)} of {len(during)} samples during the launch read something else "
                          f"than busy (screenshot: tests/output/kernel-busy-mid-run.png): {not_busy[:10]}")
    # meanwhile the panel followed the run over its comm (asked, and got the state and deltas), and the kernel
    # published no idle status at all
    assert any(sample["launchRunning"] for sample in during)
    assert during[-1]["commSent"] >= 1 and during[-1]["commReceived"] - during[0]["commReceived"] >= 2, during[-1]
    assert during[-1]["idleStatuses"] == during[0]["idleStatuses"], (during[0], during[-1])
    after = samples[-1]
    assert not after["running"] and after["statusBar"].endswith("| Idle") and after["toolbar"] == "idle", after
    assert page.locator(idle_bar).inner_text().endswith("| Idle")


FIGURE_CELL = '''\
%matplotlib inline
from notebook_launcher import notebook_launcher

def plot():
    import matplotlib.pyplot as plt
    import torch.distributed as dist
    if dist.get_rank() == 0:
        plt.plot([3, 1, 2, 5])
        plt.title("loss of rank 0")
        plt.show()
    return dist.get_rank()

notebook_launcher(plot, num_processes=2, device="cpu")
'''

# JS: the cell's images, as the page shows them (decoded, with a size)
IMAGES_JS = f"""() => Array.from(document.querySelectorAll('{CELL} .jp-OutputArea-output img')).map(img => (
    {{src: img.getAttribute('src'), width: img.naturalWidth, height: img.naturalHeight, complete: img.complete}}))"""


def _shown_images(page) -> list[dict]:
    page.wait_for_function(f"() => {{ const images = ({IMAGES_JS})(); return images.length > 0 "
                           "&& images.every(image => image.complete && image.width > 0); }", timeout=120_000)
    return page.evaluate(IMAGES_JS)


def test_a_rank_0_figure_is_an_image_in_the_cell_saved_and_shown_after_a_reload(lab):
    pytest.importorskip("matplotlib")
    root, url, browser = lab
    _notebook(root / "figure.ipynb", [FIGURE_CELL])
    page = open_notebook(browser, url, "figure.ipynb")
    command(page, "notebook:run-all-cells", wait=False)
    page.wait_for_function(f"() => {{ {CELL_STATE_JS} return !running && panel && panel.dataset.status === 'finished'; }}",
                           timeout=180_000)
    (shown,) = _shown_images(page)  # rank 0's figure, once; rank 1 draws none
    assert shown["src"].startswith("data:image/png;base64,") and shown["width"] > 100 and shown["height"] > 100
    png = base64.b64decode(shown["src"].split(",", 1)[1])
    assert png.startswith(b"\x89PNG\r\n\x1a\n")
    assert page.locator(f"{CELL} .jp-OutputArea-output img").is_visible()

    # saved: the notebook's file holds that image
    command(page, "docmanager:save")
    saved = nbformat.read(str(root / "figure.ipynb"), as_version=4)
    figures = [output for output in saved.cells[0].outputs
               if output.output_type == "display_data" and "image/png" in output.data]
    assert len(figures) == 1, [output.get("data", {}).get("text/plain") for output in saved.cells[0].outputs]
    assert figures[0].data["text/plain"].startswith("[rank 0] <Figure size")
    assert base64.b64decode(figures[0].data["image/png"]) == png

    # reloaded: the page draws it again, from the file
    page.reload()
    page.wait_for_selector(f'{CELL} .nl-run[data-status="finished"]', timeout=90_000)
    (reloaded,) = _shown_images(page)
    assert base64.b64decode(reloaded["src"].split(",", 1)[1]) == png
    assert reloaded["width"] == shown["width"] and reloaded["height"] == shown["height"]
    image = page.locator(f"{CELL} .jp-OutputArea-output img")
    image.scroll_into_view_if_needed()
    assert image.is_visible()
    screenshot(page, "figure-after-reload.png", f"{CELL} .jp-OutputArea")
