/**
 * The run panel: renders one `application/vnd.notebook-launcher.run.v1+json` payload (see ../SCHEMA.md).
 *
 * The kernel updates the same output a few times a second, and JupyterLab then calls `renderModel` again on
 * the same widget. So `RunView.update` patches the DOM in place: each section is rebuilt only when its own
 * data changed, and a rank's lines are appended (and the oldest removed) by their run-wide number `n`,
 * keeping a column's scroll position pinned to the bottom unless the user scrolled up in it.
 *
 * All user text goes in with `textContent` (see dom.ts), so the renderer is registered as safe.
 */

import type { IRenderMime } from '@jupyterlab/rendermime-interfaces';
import { Widget } from '@lumino/widgets';

import { chartMetric, IDomain, seriesDomain, STEP_TIME } from './chart';
import { createRankView, IRankView, updateRank } from './columns';
import { badge, h, setData } from './dom';
import { formatElapsed } from './format';
import { RankGrid } from './grid';
import { renderBalance } from './balance';
import { HangCard } from './hang';
import { ILiveOptions, LiveLink } from './live';
import {
  IFailure,
  IOomRetry,
  IRank,
  IRun,
  IShapeMismatch,
  ISummary,
  ITrigger,
  MIME_TYPE
} from './schema';

/** Above this many ranks the panel shows the grid (grid.ts), not one column per rank. */
export const GRID_ABOVE = 8;

/** How long after its last update a running run's clock keeps moving (the kernel sends one every 30 s). */
const CLOCK_LIMIT_S = 45;

/** The panel's DOM and the state needed to update it cheaply. */
export class RunView {
  readonly node = h('div', 'nl-run');
  private readonly header = h('div', 'nl-header');
  private readonly failure = h('section', 'nl-failure');
  private readonly hang = new HangCard();
  private readonly mismatches = h('section', 'nl-mismatches');
  private readonly oom = h('section', 'nl-oom');
  private readonly triggers = h('section', 'nl-triggers');
  private readonly balance = h('section', 'nl-balance');
  private readonly ranks = h('div', 'nl-ranks');
  private readonly layoutBar = h('div', 'nl-layout');
  private readonly savedNote = h('span', 'nl-saved-note');
  private readonly layoutToggle = h('button', 'nl-layout-toggle');
  private readonly grid = new RankGrid();
  /** 'auto': the grid above GRID_ABOVE ranks, columns up to it; the toggle picks one for this panel. */
  private layout: 'auto' | 'grid' | 'columns' = 'auto';
  private lastRun: IRun | null = null;
  private readonly keys = new Map<string, string>();
  private readonly rankViews = new Map<number, IRankView>();
  /**
   * JupyterLab renders an output before it is in the page, and the windowed notebook moves cells in and
   * out of it, which resets scroll positions: re-pin a column whenever its box gets (re)laid out.
   */
  private readonly resizes =
    typeof ResizeObserver === 'undefined'
      ? null
      : new ResizeObserver(entries => this.onResize(entries));

  constructor() {
    this.layoutToggle.type = 'button';
    this.layoutBar.append(this.savedNote, this.layoutToggle);
    this.layoutToggle.addEventListener('click', () => {
      this.layout =
        this.layoutToggle.dataset.layout === 'grid' ? 'columns' : 'grid';
      if (this.lastRun) {
        this.update(this.lastRun);
      }
    });
    this.node.append(this.header, this.layoutBar, this.ranks);
  }

  /** Stop observing (the renderer is disposed). */
  dispose(): void {
    this.resizes?.disconnect();
    this.stopClock();
  }

  private clock: ReturnType<typeof setInterval> | null = null;

  /**
   * While a run goes on, the elapsed time moves here, from the last update's value: the kernel sends an update
   * only when something changed (and every IDLE_UPDATE_S), not once a second. A run whose kernel went away
   * (a notebook saved mid-run and reopened) stops moving CLOCK_LIMIT_S after its last update.
   */
  private startClock(run: IRun): void {
    this.stopClock();
    if (
      (run.status !== 'running' && run.status !== 'starting') ||
      typeof run.elapsed !== 'number'
    ) {
      return;
    }
    const base = run.elapsed;
    const received = Date.now();
    this.clock = setInterval(() => {
      const since = (Date.now() - received) / 1000;
      const field = this.header.querySelector<HTMLElement>(
        '[data-field="elapsed"]'
      );
      if (since > CLOCK_LIMIT_S || !field) {
        this.stopClock();
        return;
      }
      field.textContent = formatElapsed(base + since);
      this.hang.tick(base + since);
    }, 1000);
  }

  private stopClock(): void {
    if (this.clock !== null) {
      clearInterval(this.clock);
      this.clock = null;
    }
  }

  /** Render a new state of the run, touching only what changed. */
  update(run: IRun): void {
    setData(this.node, {
      status: run.status || 'unknown',
      runId: run.run_id,
      attempt: run.attempt
    });
    this.section(this.header, 'header', headerKey(run), () =>
      renderHeader(run)
    );
    this.startClock(run);
    const failure = run.failure || null;
    this.section(this.failure, 'failure', JSON.stringify(failure), () =>
      renderFailure(failure)
    );
    setData(this.failure, { kind: failure?.kind, rank: failure?.rank });
    const hang = this.hang.update(run.hang, run.hangs, run.elapsed);
    const mismatches = run.shape_mismatches || [];
    const retried = (run.attempt || 1) > 1;
    this.section(
      this.mismatches,
      'mismatches',
      JSON.stringify([mismatches, retried]),
      () => mismatches.map(m => renderMismatch(m, retried))
    );
    const oom = run.oom_retries || [];
    this.section(this.oom, 'oom', JSON.stringify(oom), () => renderOom(oom));
    const triggers = run.triggers || [];
    this.section(
      this.triggers,
      'triggers',
      JSON.stringify([triggers, retried]),
      () => renderTriggers(triggers, retried)
    );
    const balance = run.balance || null;
    this.section(this.balance, 'balance', JSON.stringify(balance), () =>
      renderBalance(balance)
    );
    setData(this.balance, {
      straggler: balance?.straggler ?? null,
      final: balance ? String(!!balance.final) : null
    });
    this.placeSections([
      [this.header, true],
      [this.failure, !!failure],
      [this.hang.node, hang],
      [this.mismatches, mismatches.length > 0],
      [this.oom, oom.length > 0],
      [this.triggers, triggers.length > 0],
      [this.balance, this.balance.childElementCount > 0]
    ]);
    this.updateRanks(run);
  }

  /** Rebuild a section's children when its key changed. */
  private section(
    node: HTMLElement,
    name: string,
    key: string,
    build: () => Node[] | null
  ): void {
    if (this.keys.get(name) === key) {
      return;
    }
    this.keys.set(name, key);
    node.replaceChildren(...(build() || []));
  }

  /** Keep present sections in order above the rank grid, and empty ones out of the DOM. */
  private placeSections(sections: [HTMLElement, boolean][]): void {
    let anchor: HTMLElement = this.layoutBar;
    for (const [node, present] of sections.reverse()) {
      if (!present) {
        node.remove();
        continue;
      }
      if (node.parentNode !== this.node || node.nextSibling !== anchor) {
        this.node.insertBefore(node, anchor);
      }
      anchor = node;
    }
  }

  /** Whether the ranks show as the grid (many ranks, or asked) rather than as columns. */
  get showsGrid(): boolean {
    return this.layoutToggle.dataset.layout === 'grid';
  }

  private updateRanks(run: IRun): void {
    this.lastRun = run;
    const ranks = run.ranks || [];
    const grid =
      this.layout === 'grid' ||
      (this.layout === 'auto' && ranks.length > GRID_ABOVE);
    this.layoutToggle.dataset.layout = grid ? 'grid' : 'columns';
    this.layoutToggle.textContent = grid ? 'show columns' : 'show grid';
    this.layoutToggle.hidden = ranks.length < 2;
    const saved = run.saved;
    this.savedNote.hidden = !saved;
    this.savedNote.textContent = saved
      ? `This output keeps the newest ${saved.lines_kept} of ${saved.lines_total} lines; the run log has all of them: ${run.run_dir || ''}`
      : '';
    if (grid) {
      this.dropColumns();
      this.ranks.replaceWith(this.grid.node);
      this.grid.update(run, this.domains(ranks));
      return;
    }
    this.grid.node.replaceWith(this.ranks);
    this.ranks.style.setProperty(
      '--nl-cols',
      String(Math.max(1, ranks.length))
    );
    this.ranks.dataset.count = String(ranks.length);
    const domains = this.domains(ranks);

    const seen = new Set<number>();
    let previous: HTMLElement | null = null;
    for (const rank of ranks) {
      seen.add(rank.rank);
      let view = this.rankViews.get(rank.rank);
      if (!view) {
        view = createRankView();
        this.rankViews.set(rank.rank, view);
        this.resizes?.observe(view.lines);
      }
      const wanted: ChildNode | null = previous
        ? previous.nextSibling
        : this.ranks.firstChild;
      if (view.node !== wanted) {
        this.ranks.insertBefore(view.node, wanted);
      }
      previous = view.node;
      updateRank(view, rank, run, domains);
    }
    for (const [id, view] of this.rankViews) {
      if (!seen.has(id)) {
        this.resizes?.unobserve(view.lines);
        view.node.remove();
        this.rankViews.delete(id);
      }
    }
    this.repin();
  }

  private domains(ranks: IRank[]): [string, IDomain | null][] {
    const metric = chartMetric(ranks);
    return [
      ...(metric
        ? [[metric, seriesDomain(ranks, metric)] as [string, IDomain | null]]
        : []),
      [STEP_TIME, seriesDomain(ranks, STEP_TIME)]
    ];
  }

  /** The grid replaces the columns: their DOM goes (64 columns of lines are what the grid avoids). */
  private dropColumns(): void {
    for (const view of this.rankViews.values()) {
      this.resizes?.unobserve(view.lines);
      view.node.remove();
    }
    this.rankViews.clear();
  }

  private onResize(entries: ResizeObserverEntry[]): void {
    for (const view of this.rankViews.values()) {
      if (view.pinned && entries.some(entry => entry.target === view.lines)) {
        view.lines.scrollTop = view.lines.scrollHeight;
      }
    }
  }

  /** Scroll pinned columns to the bottom (after an update, and when the panel is attached or shown). */
  repin(): void {
    for (const view of this.rankViews.values()) {
      if (view.pinned) {
        view.lines.scrollTop = view.lines.scrollHeight;
      }
    }
  }
}

/** A MIME renderer around `RunView` (renderModel: each update); with `live` it follows a running run (live.ts). */
export class RunRenderer extends Widget implements IRenderMime.IRenderer {
  private readonly view = new RunView();
  private readonly link: LiveLink | null;

  constructor(
    _options?: IRenderMime.IRendererOptions,
    live?: ILiveOptions | null
  ) {
    super();
    this.link = live
      ? live.runs.link(run => this.view.update(run), live.kernel)
      : null;
    this.addClass('nl-run-widget');
    this.node.appendChild(this.view.node);
  }

  protected onAfterAttach(): void {
    this.link?.connect();
    this.view.repin();
  }

  protected onAfterShow(): void {
    this.view.repin();
  }

  dispose(): void {
    this.link?.dispose();
    this.view.dispose();
    super.dispose();
  }

  renderModel(model: IRenderMime.IMimeModel): Promise<void> {
    let data = model.data[MIME_TYPE] as unknown;
    if (typeof data === 'string') {
      try {
        data = JSON.parse(data);
      } catch {
        data = null;
      }
    }
    if (!data || typeof data !== 'object') {
      this.view.update({ notes: ['invalid run payload'] }); // (no status: the badge says "unknown")
    } else if (this.link) {
      this.link.offer(data as IRun, this.node);
    } else {
      this.view.update(data as IRun);
    }
    return Promise.resolve();
  }
}

/** The header changes on each update anyway (elapsed), so its key is simply its data (and the ranks' rows). */
function headerKey(run: IRun): string {
  const {
    ranks,
    shape_mismatches,
    oom_retries,
    triggers,
    failure,
    hang,
    hangs,
    ...rest
  } = run;
  const rows = (ranks || []).map(rank => [
    rank.rank,
    rank.status,
    rank.summary
  ]);
  return JSON.stringify([rest, rows, toldBelow(run)]);
}

/**
 * What a card below the header tells in full, so the header does not tell it again: the verdict and its detail
 * (a failure, a live hang or an out-of-memory card has the verdict as its title), the balance line (the Balance
 * section).
 */
export function toldBelow(run: IRun): { verdict: boolean; balance: boolean } {
  const verdict =
    !!run.failure || !!run.hang?.live || (run.oom_retries || []).length > 0;
  return { verdict, balance: !!run.balance };
}

/**
 * The run's summary (SCHEMA.md, "summary"), computed by the kernel: the verdict as the header's title, its
 * detail, a compact row per rank (up to GRID_ABOVE ranks: the grid shows more), the balance line and how to
 * open the whole log.
 */
export function renderSummary(
  summary: ISummary | null | undefined,
  ranks: IRank[],
  told: { verdict: boolean; balance: boolean } = {
    verdict: false,
    balance: false
  }
): HTMLElement | null {
  if (!summary || !summary.title) {
    return null;
  }
  const box = h('div', 'nl-summary');
  setData(box, { verdict: summary.verdict });
  if (!told.verdict) {
    box.appendChild(h('div', 'nl-summary-title', summary.title));
    if (summary.detail && summary.detail.length) {
      box.appendChild(h('pre', 'nl-summary-detail', summary.detail.join('\n')));
    }
  }
  if (ranks.length && ranks.length <= GRID_ABOVE) {
    const table = h('table', 'nl-summary-rows');
    const head = h('tr');
    [
      'rank',
      'status',
      'step',
      's/step',
      'ETA',
      'warnings',
      'errors',
      'last line'
    ].forEach(name => head.appendChild(h('th', '', name)));
    table.appendChild(h('thead')).appendChild(head);
    const body = table.appendChild(h('tbody'));
    for (const rank of ranks) {
      const row = rank.summary || {};
      const tr = h('tr');
      setData(tr, { rank: rank.rank, status: rank.status });
      [
        String(rank.rank),
        rank.status || '',
        row.step || '',
        (row.speed || '').replace(' s/step', ''),
        row.eta || '',
        String(row.warnings || 0),
        String(row.errors || 0),
        row.last || ''
      ].forEach((cell, index) =>
        tr.appendChild(h('td', index === 7 ? 'nl-summary-last' : '', cell))
      );
      body.appendChild(tr);
    }
    box.appendChild(table);
  }
  const foot = [
    told.balance ? null : summary.balance,
    summary.inspect ? `whole log: ${summary.inspect}` : null
  ].filter(Boolean);
  if (foot.length) {
    box.appendChild(h('div', 'nl-summary-foot', foot.join(' · ')));
  }
  return box;
}

function renderHeader(run: IRun): Node[] {
  const top = h('div', 'nl-header-top');
  top.append(
    badge(run.status, 'nl-status'),
    h('span', 'nl-run-id', run.run_id || '')
  );
  const fields = h('div', 'nl-fields');
  const ranks =
    run.world_size && run.num_processes && run.world_size !== run.num_processes
      ? `${run.num_processes} of ${run.world_size} ranks here`
      : `${run.num_processes ?? run.world_size ?? (run.ranks || []).length} ranks`;
  const values: [string, string | null][] = [
    ['ranks', ranks],
    ['device', run.device ?? null],
    ['backend', run.backend ?? null],
    [
      'start-method',
      run.start_method ? `start method ${run.start_method}` : null
    ],
    ['elapsed', formatElapsed(run.elapsed) || null],
    [
      'attempt',
      typeof run.attempt === 'number' && run.attempt > 1
        ? `attempt ${run.attempt}`
        : null
    ],
    [
      'batch-size',
      typeof run.batch_size === 'number' ? `batch size ${run.batch_size}` : null
    ],
    ['result', run.result?.type ? `returned ${run.result.type}` : null]
  ];
  for (const [name, value] of values) {
    if (value) {
      const field = h('span', 'nl-field', value);
      field.dataset.field = name;
      fields.appendChild(field);
    }
  }
  top.appendChild(fields);
  const out: Node[] = [top];
  const summary = renderSummary(run.summary, run.ranks || [], toldBelow(run));
  if (summary) {
    out.push(summary);
  }
  if (run.notes && run.notes.length) {
    const notes = h('ul', 'nl-notes');
    run.notes.forEach(note => notes.appendChild(h('li', 'nl-note', note)));
    out.push(notes);
  }
  return out;
}

function failureTitle(failure: IFailure): string {
  const verdict = (failure.verdict || '')
    .split('\n')
    .map(line => line.trim())
    .filter(Boolean)
    .join(' ');
  if (verdict) {
    return verdict;
  }
  switch (failure.kind) {
    case 'hang':
      return 'Hung: the ranks stopped making progress (each rank’s stack is below)';
    case 'timeout':
      return 'Timed out';
    case 'interrupted':
      return 'Interrupted';
    default: {
      const who =
        typeof failure.rank === 'number'
          ? `Rank ${failure.rank} failed`
          : 'Failed';
      return failure.type ? `${who}: ${failure.type}` : who;
    }
  }
}

/** Its verdict as the title, the root cause's traceback, the rest of the error, each rank's stack: each once. */
function renderFailure(failure: IFailure | null): Node[] | null {
  if (!failure) {
    return null;
  }
  const out: Node[] = [h('h3', 'nl-failure-title', failureTitle(failure))];
  if (failure.traceback) {
    out.push(h('pre', 'nl-traceback', failure.traceback));
  }
  if (failure.message) {
    out.push(h('pre', 'nl-failure-message', failure.message));
  }
  const stacks = Object.entries(failure.stacks || {}).sort(
    ([a], [b]) => Number(a) - Number(b)
  );
  for (const [rank, stack] of stacks) {
    const box = h('div', 'nl-stack');
    box.dataset.rank = rank;
    box.append(
      h('div', 'nl-label', `rank ${rank}'s Python stack`),
      h('pre', 'nl-stack-text', stack)
    );
    out.push(box);
  }
  return out;
}

function formatShape(shape: unknown): string {
  return Array.isArray(shape)
    ? `[${shape.join(', ')}]`
    : shape === undefined || shape === null
      ? ''
      : JSON.stringify(shape);
}

/** One card per mismatch: a table of what each process called; rows whose shape differs from most are marked. */
function renderMismatch(
  mismatch: IShapeMismatch,
  retried: boolean
): HTMLElement {
  const card = h('div', 'nl-mismatch nl-card');
  setData(card, { attempt: mismatch.attempt });
  const title = h(
    'div',
    'nl-card-title',
    `Shape mismatch in ${mismatch.operation || 'a collective'}`
  );
  if (typeof mismatch.t === 'number') {
    title.appendChild(
      h(
        'span',
        'nl-time',
        ` at ${formatElapsed(mismatch.t)}${attemptNote(mismatch.attempt, retried)}`
      )
    );
  }
  card.appendChild(title);
  const processes = mismatch.processes || [];
  const counts = new Map<string, number>();
  processes.forEach(p =>
    counts.set(
      formatShape(p.shape),
      (counts.get(formatShape(p.shape)) || 0) + 1
    )
  );
  const common = [...counts.entries()].sort((a, b) => b[1] - a[1])[0]?.[0];
  const table = h('table', 'nl-table');
  const headRow = h('tr');
  ['process', 'operation', 'shape', 'dtype', 'call site'].forEach(name =>
    headRow.appendChild(h('th', '', name))
  );
  table.appendChild(h('thead')).appendChild(headRow);
  const body = table.appendChild(h('tbody'));
  for (const p of processes) {
    const row = h('tr');
    const shape = formatShape(p.shape);
    setData(row, {
      rank: p.rank,
      differs: counts.size > 1 && shape !== common ? 'true' : null
    });
    [
      `rank ${p.rank}`,
      p.operation || '',
      shape,
      p.dtype || '',
      p.call_site || ''
    ].forEach(cell => row.appendChild(h('td', '', cell)));
    body.appendChild(row);
  }
  card.appendChild(table);
  if (mismatch.message) {
    card.appendChild(h('pre', 'nl-mismatch-message', mismatch.message));
  }
  return card;
}

/** "rank 1", "ranks 0, 1". */
function ranksText(ranks: number[] | undefined): string {
  const list = ranks || [];
  return `${list.length === 1 ? 'rank' : 'ranks'} ${list.join(', ')}`;
}

/** Out-of-memory retries, amber: each a step down in batch size that every rank retried at, with its error. */
function renderOom(retries: IOomRetry[]): Node[] {
  const out: Node[] = [
    h(
      'div',
      'nl-section-title',
      'Out of memory: retried at a smaller batch size'
    )
  ];
  for (const retry of retries) {
    const row = h('div', 'nl-oom-row');
    setData(row, {
      batchSize: retry.batch_size,
      newBatchSize: retry.new_batch_size
    });
    row.append(
      h('span', 'nl-time', formatElapsed(retry.t)),
      h(
        'span',
        'nl-oom-sizes',
        `batch size ${retry.batch_size ?? '?'} → retried at batch size ${retry.new_batch_size ?? '?'}`
      ),
      h('span', 'nl-oom-ranks', `out of memory on ${ranksText(retry.ranks)}`),
      h('span', 'nl-oom-error', retry.error || '')
    );
    out.push(row);
  }
  return out;
}

/** Once a run restarted, events say which try they belong to. */
function attemptNote(attempt: number | undefined, retried: boolean): string {
  return retried && typeof attempt === 'number' ? ` (attempt ${attempt})` : '';
}

function renderTriggers(triggers: ITrigger[], retried: boolean): Node[] {
  const list = h('ul', 'nl-trigger-list');
  for (const trigger of triggers) {
    const when = `${formatElapsed(trigger.t)}${attemptNote(trigger.attempt, retried)}`;
    const item = h(
      'li',
      'nl-trigger',
      `rank ${trigger.rank} at ${when}: ${trigger.call_site || ''}`
    );
    setData(item, { rank: trigger.rank, attempt: trigger.attempt });
    list.appendChild(item);
  }
  return [h('div', 'nl-section-title', 'Triggers (set_trigger)'), list];
}
