/**
 * The "Runs" sidebar (its plugin is in index.ts): lists every run panel found in the outputs of the open
 * notebooks. The output models signal each `update_display_data`; a run a panel follows over its comm (the
 * page's `ILiveRuns`, live.ts, when the live plugin is there) is shown from that newer state.
 *
 * A detached run (`detach=True`) that is going on has a stop button: it asks the kernel that follows the run
 * (over the run's comm) to stop it, as `run.stop()` does, after the user confirms. A foreground run has none: an
 * interrupt of its kernel stops it.
 */

import type { JupyterFrontEnd } from '@jupyterlab/application';
import type { ICellModel, ICodeCellModel } from '@jupyterlab/cells';
import type { INotebookTracker, NotebookPanel } from '@jupyterlab/notebook';
import { LabIcon } from '@jupyterlab/ui-components';
import { Throttler } from '@lumino/polling';
import { Widget } from '@lumino/widgets';

import { badge, h, setData } from './dom';
import {
  formatElapsed,
  formatProgress,
  progressFraction,
  rankCounts,
  slowestProgress
} from './format';
import { isRunning, type ILiveRuns } from './live';
import { IRun, MIME_TYPE } from './schema';

export const SIDEBAR_ID = 'notebook-launcher-runs';

/** Rescans at most this often (a trailing-edge throttle): outputs update a few times a second per run. */
const RESCAN_MS = 150;

export const runsIcon = new LabIcon({
  name: 'notebook-launcher-panel:runs',
  svgstr:
    '<svg xmlns="http://www.w3.org/2000/svg" width="16" height="16" viewBox="0 0 24 24">' +
    '<g class="jp-icon3" fill="#616161">' +
    '<rect x="3" y="4" width="18" height="4" rx="1"/><rect x="3" y="10" width="13" height="4" rx="1"/>' +
    '<rect x="3" y="16" width="8" height="4" rx="1"/></g></svg>'
});

/** Asks the user whether to stop the run (index.ts gives JupyterLab's dialog). */
export type ConfirmStop = (runId: string) => Promise<boolean>;

/**
 * An entry's stop button: none unless the run is detached and going on; enabled where the page follows the run
 * over a comm its kernel answers (that kernel can stop it), else disabled: no kernel here knows the run (a
 * reload, a new kernel) until `attach()` shows it.
 */
export function stopButton(
  run: IRun,
  live: ILiveRuns | null
): 'enabled' | 'disabled' | null {
  if (!run.detached || !isRunning(run)) {
    return null;
  }
  return live?.canStop(run.run_id) ? 'enabled' : 'disabled';
}

/** A run found in a notebook output, with where to find it again. */
interface IFoundRun {
  key: string;
  panel: NotebookPanel;
  cell: ICellModel;
  run: IRun;
  stop: 'enabled' | 'disabled' | null;
}

/**
 * Find every run payload in the code cells' outputs of the open notebooks, in notebook and cell order (each
 * run as `live` has it, where that is newer).
 */
export function findRuns(
  tracker: INotebookTracker,
  live: ILiveRuns | null = null
): IFoundRun[] {
  const found: IFoundRun[] = [];
  const seen = new Set<string>();
  tracker.forEach(panel => {
    if (panel.isDisposed) {
      return;
    }
    const cells = panel.context.model.cells;
    for (let i = 0; i < cells.length; i++) {
      const cell = cells.get(i);
      if (cell.type !== 'code') {
        continue;
      }
      const outputs = (cell as ICodeCellModel).outputs;
      for (let j = 0; j < outputs.length; j++) {
        const saved = outputs.get(j).data[MIME_TYPE] as IRun | undefined;
        if (!saved || typeof saved !== 'object') {
          continue;
        }
        // a panel following the run over its comm has a newer state than the output (refreshed rarely)
        const state = live?.liveState(saved.run_id);
        const run =
          state && (state.seq ?? 0) >= (saved.seq ?? 0) ? state : saved;
        const key = `${panel.id}:${run.run_id ?? `${cell.id}:${j}`}`;
        if (!seen.has(key)) {
          seen.add(key);
          found.push({ key, panel, cell, run, stop: stopButton(run, live) });
        }
      }
    }
  });
  return found;
}

/** The sidebar widget: `.nl-sidebar` with one `.nl-sidebar-run` per run. */
export class RunsSidebar extends Widget {
  private readonly list = h('ul', 'nl-sidebar-list');
  private readonly empty = h(
    'div',
    'nl-sidebar-empty',
    'No runs in the open notebooks.'
  );
  private readonly items = new Map<
    string,
    { node: HTMLLIElement; key: string }
  >();
  private found = new Map<string, IFoundRun>();
  /** Many signals in a burst cost one rescan, RESCAN_MS after the first. */
  private readonly rescan = new Throttler(() => this.refresh(), {
    limit: RESCAN_MS,
    edge: 'trailing'
  });

  /** Run ids whose stop the user asked for: their button says so until the run's end comes. */
  private readonly stopping = new Set<string>();

  constructor(
    private readonly tracker: INotebookTracker,
    private readonly shell: JupyterFrontEnd.IShell,
    private readonly live: ILiveRuns | null = null,
    private readonly confirmStop: ConfirmStop = () => Promise.resolve(true)
  ) {
    super();
    this.id = SIDEBAR_ID;
    this.addClass('nl-sidebar');
    this.title.icon = runsIcon;
    this.title.caption = 'Runs';
    this.node.append(
      h('div', 'nl-sidebar-title', 'Runs'),
      this.empty,
      this.list
    );
    this.list.addEventListener('click', event => {
      if (stopTarget(event)) {
        void this.onStop(event);
      } else {
        this.onActivate(event);
      }
    });
    this.list.addEventListener('keydown', event => {
      if (stopTarget(event)) {
        return; // the button's own Enter and space make a click
      }
      if (event.key === 'Enter' || event.key === ' ') {
        event.preventDefault();
        this.onActivate(event);
      }
    });
    tracker.widgetAdded.connect((_, panel) => this.watchPanel(panel));
    tracker.forEach(panel => this.watchPanel(panel));
    live?.stateChanged.connect(this.schedule, this); // (disconnected by Widget.dispose: Signal.clearData)
    this.schedule();
  }

  dispose(): void {
    this.rescan.dispose();
    super.dispose();
  }

  /** Rescan soon; many signals in a burst cost one rescan. */
  schedule(): void {
    if (!this.isDisposed) {
      this.rescan
        .invoke()
        .catch(reason =>
          console.error('notebook-launcher-panel: the Runs list', reason)
        );
    }
  }

  /** Rescan now and patch the list, rebuilding only the entries whose run changed. */
  refresh(): void {
    const runs = findRuns(this.tracker, this.live);
    this.found = new Map(runs.map(found => [found.key, found]));
    let previous: HTMLElement | null = null;
    for (const found of runs) {
      const runId = found.run.run_id || '';
      if (!isRunning(found.run)) {
        this.stopping.delete(runId); // its end came
      }
      const stopping = this.stopping.has(runId);
      const dataKey = entryKey(found) + (stopping ? ':stopping' : '');
      let item = this.items.get(found.key);
      if (!item) {
        item = { node: h('li', 'nl-sidebar-run'), key: '' };
        item.node.tabIndex = 0;
        item.node.setAttribute('role', 'button');
        item.node.dataset.key = found.key;
        this.items.set(found.key, item);
      }
      if (item.key !== dataKey) {
        item.key = dataKey;
        renderEntry(item.node, found, stopping);
      }
      const wanted: ChildNode | null = previous
        ? previous.nextSibling
        : this.list.firstChild;
      if (item.node !== wanted) {
        this.list.insertBefore(item.node, wanted);
      }
      previous = item.node;
    }
    for (const [key, item] of this.items) {
      if (!this.found.has(key)) {
        item.node.remove();
        this.items.delete(key);
      }
    }
    this.empty.hidden = runs.length > 0;
  }

  private watchPanel(panel: NotebookPanel): void {
    const cells = panel.context.model.cells;
    const watchCells = () => {
      // Lumino ignores a second connect of the same slot, so rewatching every cell is harmless.
      for (let i = 0; i < cells.length; i++) {
        const cell = cells.get(i);
        if (cell.type === 'code') {
          (cell as ICodeCellModel).outputs.changed.connect(this.schedule, this);
          (cell as ICodeCellModel).outputs.stateChanged.connect(
            this.schedule,
            this
          );
        }
      }
      this.schedule();
    };
    cells.changed.connect(watchCells);
    panel.context.pathChanged.connect(this.schedule, this);
    panel.disposed.connect(() => {
      cells.changed.disconnect(watchCells);
      this.schedule();
    });
    watchCells();
  }

  /** The stop button: after the user confirms, ask the run's kernel to stop it. */
  private async onStop(event: Event): Promise<void> {
    const node = (event.target as HTMLElement).closest<HTMLElement>(
      '.nl-sidebar-run'
    );
    const found = node ? this.found.get(node.dataset.key || '') : undefined;
    const runId = found?.run.run_id;
    if (!found || !runId || found.stop !== 'enabled' || !this.live) {
      return;
    }
    if (!this.live.canStop(runId)) {
      this.refresh(); // its kernel went away (a restart): greyed out, nothing asked
      return;
    }
    if (!(await this.confirmStop(runId))) {
      return;
    }
    if (this.live.stop(runId)) {
      this.stopping.add(runId);
    }
    this.refresh();
  }

  /** Show the run's notebook and scroll its cell into view. */
  private onActivate(event: Event): void {
    const node = (event.target as HTMLElement).closest<HTMLElement>(
      '.nl-sidebar-run'
    );
    const found = node ? this.found.get(node.dataset.key || '') : undefined;
    if (!found || found.panel.isDisposed) {
      return;
    }
    const { panel, cell } = found;
    this.shell.activateById(panel.id);
    const cells = panel.context.model.cells;
    let index = -1;
    for (let i = 0; i < cells.length; i++) {
      if (cells.get(i) === cell) {
        index = i;
        break;
      }
    }
    const widget = panel.content.widgets[index];
    if (widget) {
      panel.content.activeCellIndex = index;
      // After activation, so the notebook has a layout to scroll in.
      requestAnimationFrame(
        () => void panel.content.scrollToCell(widget, 'start')
      );
    }
  }
}

/** The stop button an event is on, if any. */
function stopTarget(event: Event): HTMLElement | null {
  return (event.target as HTMLElement).closest<HTMLElement>('.nl-sidebar-stop');
}

/**
 * One entry: status, run id, notebook, elapsed, rank counts, the slowest rank's progress; a detached run's stop
 * button.
 */
function renderEntry(
  node: HTMLLIElement,
  found: IFoundRun,
  stopping: boolean
): void {
  const { run, panel } = found;
  const counts = rankCounts(run);
  setData(node, {
    runId: run.run_id,
    status: run.status || 'unknown',
    notebook: panel.context.path,
    running: counts.running || 0,
    failed: counts.failed || 0,
    stuck: counts.stuck || 0,
    hang: run.hang?.live ? 'live' : null
  });
  const top = h('div', 'nl-sidebar-run-top');
  top.append(
    badge(run.status, 'nl-status'),
    h('span', 'nl-sidebar-run-id', run.run_id || '(no id)')
  );
  if (found.stop) {
    const button = h(
      'button',
      'nl-sidebar-stop',
      stopping ? 'stopping…' : 'Stop'
    );
    button.type = 'button';
    button.disabled = stopping || found.stop === 'disabled';
    button.title =
      found.stop === 'enabled'
        ? 'Stop this detached run: every rank and its supervisor end'
        : `No kernel of this page follows this run: attach("${run.run_id}") in a cell shows it, then it can be stopped here`;
    setData(button, { stop: stopping ? 'stopping' : found.stop });
    top.append(button);
  }
  const name = panel.context.path.split('/').pop() || panel.context.path;
  const meta = h(
    'div',
    'nl-sidebar-run-meta',
    [name, formatElapsed(run.elapsed)].filter(Boolean).join(' · ')
  );
  const parts = [
    `${counts.running || 0} running`,
    `${counts.failed || 0} failed`,
    `${counts.stuck || 0} stuck`
  ];
  for (const status of [
    'waiting',
    'busy',
    'in DDP',
    'starting',
    'finished',
    'stopped'
  ]) {
    if (counts[status]) {
      parts.push(`${counts[status]} ${status}`);
    }
  }
  if (run.hang?.live) {
    parts.unshift('possible hang');
  }
  const ranks = h('div', 'nl-sidebar-run-ranks', parts.join(' · '));
  const children: Node[] = [top, meta, ranks];
  const progress = slowestProgress(run.ranks);
  if (progress) {
    const box = h('div', 'nl-progress');
    setData(box, { step: progress.step, total: progress.total });
    const bar = box.appendChild(h('div', 'nl-progress-bar'));
    const fraction = progressFraction(progress);
    bar.classList.toggle('nl-indeterminate', fraction === null);
    bar.appendChild(h('div', 'nl-progress-fill')).style.width =
      fraction === null ? '100%' : `${(fraction * 100).toFixed(1)}%`;
    box.appendChild(
      h(
        'div',
        'nl-progress-text',
        formatProgress({ step: progress.step, total: progress.total })
      )
    );
    children.push(box);
  }
  node.replaceChildren(...children);
}

/** What an entry shows, so a run's many lines do not make each rescan costly. */
function entryKey(found: IFoundRun): string {
  const run = found.run;
  const ranks = (run.ranks || []).map(rank => [
    rank.status,
    rank.progress?.step,
    rank.progress?.total,
    rank.progress?.step_time,
    rank.progress?.metrics
  ]);
  return JSON.stringify([
    run.run_id,
    run.status,
    run.elapsed,
    run.attempt,
    run.hang?.live,
    run.failure?.kind,
    ranks,
    found.panel.context.path,
    found.stop
  ]);
}
