/**
 * The rank grid: one small cell per rank, for runs with many ranks (above 8, or when asked). A cell shows the
 * rank's status colour, step and progress, step time, last line, the straggler mark (the balance's straggler)
 * and the hang badge; cells are grouped by host, and in each group failed and stuck ranks come first. A filter
 * keeps ranks of one kind of status. A click opens the rank's column (columns.ts) below the grid; a column can
 * be pinned, so a few stay side by side while another cell is opened.
 */

import { IDomain } from './chart';
import { createRankView, IRankView, updateRank } from './columns';
import { h, setData } from './dom';
import { formatNumber, progressFraction } from './format';
import { IBalance, IRank, IRun } from './schema';

/** Ranks kept side by side at most (the oldest pin goes first). */
export const MAX_PINNED = 4;

/** The filter a status belongs to. */
export function statusGroup(status: string | undefined): string {
  switch (status) {
    case 'failed':
      return 'failed';
    case 'stuck':
    case 'waiting':
    case 'busy':
    case 'in DDP':
      return 'stuck';
    case 'finished':
      return 'finished';
    case 'stopped':
      return 'stopped';
    default:
      return 'running';
  }
}

const FILTERS = ['all', 'failed', 'stuck', 'running', 'finished', 'stopped'];
const TROUBLE = new Set(['failed', 'stuck']);

interface ICell {
  node: HTMLElement;
  key: string;
}

interface IColumn {
  node: HTMLElement;
  pin: HTMLButtonElement;
  view: IRankView;
}

type GridRank = IRank;

export class RankGrid {
  readonly node = h('div', 'nl-grid');
  private readonly filters = h('div', 'nl-grid-filters');
  private readonly cellsNode = h('div', 'nl-grid-cells');
  private readonly openNode = h('div', 'nl-grid-open');
  private readonly cells = new Map<number, ICell>();
  private readonly groups = new Map<string, HTMLElement>();
  private readonly columns = new Map<number, IColumn>();
  private filter = 'all';
  private opened: number | null = null;
  private pinned: number[] = [];
  private last: { run: IRun; domains: [string, IDomain | null][] } | null =
    null;

  constructor() {
    this.node.append(this.filters, this.cellsNode, this.openNode);
    this.cellsNode.addEventListener('click', event => {
      const cell = (event.target as HTMLElement).closest<HTMLElement>(
        '.nl-cell'
      );
      if (cell && cell.dataset.rank !== undefined) {
        this.toggle(Number(cell.dataset.rank));
      }
    });
    this.cellsNode.addEventListener('keydown', event => {
      const cell = (event.target as HTMLElement).closest<HTMLElement>(
        '.nl-cell'
      );
      if (cell && (event.key === 'Enter' || event.key === ' ')) {
        event.preventDefault();
        this.toggle(Number(cell.dataset.rank));
      }
    });
    this.filters.addEventListener('click', event => {
      const button = (event.target as HTMLElement).closest<HTMLElement>(
        '.nl-grid-filter'
      );
      if (button && button.dataset.filter) {
        this.setFilter(button.dataset.filter);
      }
    });
  }

  /** The ranks shown as columns below the grid: the pinned ones, then the one opened last. */
  get openRanks(): number[] {
    return this.opened !== null && !this.pinned.includes(this.opened)
      ? [...this.pinned, this.opened]
      : [...this.pinned];
  }

  /** Open a rank's column (or close it when it is the one open and not pinned). */
  toggle(rank: number): void {
    this.opened =
      this.opened === rank && !this.pinned.includes(rank) ? null : rank;
    this.redraw();
  }

  /** Pin a rank's column (it stays while other cells are opened), or unpin it. */
  pin(rank: number): void {
    if (this.pinned.includes(rank)) {
      this.pinned = this.pinned.filter(r => r !== rank);
    } else {
      this.pinned = [...this.pinned, rank].slice(-MAX_PINNED);
    }
    this.redraw();
  }

  close(rank: number): void {
    this.pinned = this.pinned.filter(r => r !== rank);
    if (this.opened === rank) {
      this.opened = null;
    }
    this.redraw();
  }

  setFilter(filter: string): void {
    this.filter = FILTERS.includes(filter) ? filter : 'all';
    this.redraw();
  }

  private redraw(): void {
    if (this.last) {
      this.update(this.last.run, this.last.domains);
    }
  }

  update(run: IRun, domains: [string, IDomain | null][]): void {
    this.last = { run, domains };
    const ranks = (run.ranks || []) as GridRank[];
    const hangRanks = new Set(
      Object.keys((run.hang?.live && run.hang.ranks) || {}).map(Number)
    );
    this.node.dataset.count = String(ranks.length);
    this.node.dataset.filter = this.filter;
    this.renderFilters(ranks);

    // host groups in order of their first rank; in each, trouble first, then by rank
    const byHost = new Map<string, GridRank[]>();
    for (const rank of ranks) {
      const host = rank.host || '';
      byHost.set(host, [...(byHost.get(host) || []), rank]);
    }
    const seen = new Set<number>();
    let previousGroup: HTMLElement | null = null;
    for (const [host, members] of byHost) {
      let group = this.groups.get(host);
      if (!group) {
        group = h('div', 'nl-grid-host');
        group.append(
          h('div', 'nl-grid-host-name'),
          h('div', 'nl-grid-host-cells')
        );
        this.groups.set(host, group);
      }
      setData(group, { host: host || null });
      (group.firstChild as HTMLElement).textContent =
        `${host || 'this machine'} · ${members.length} rank${members.length === 1 ? '' : 's'}`;
      const wantedGroup: ChildNode | null = previousGroup
        ? previousGroup.nextSibling
        : this.cellsNode.firstChild;
      if (group !== wantedGroup) {
        this.cellsNode.insertBefore(group, wantedGroup);
      }
      group.classList.toggle('nl-grid-host-single', byHost.size === 1 && !host);
      previousGroup = group;
      const box = group.lastChild as HTMLElement;
      const sorted = [...members].sort(
        (a, b) =>
          Number(!TROUBLE.has(statusGroup(a.status))) -
            Number(!TROUBLE.has(statusGroup(b.status))) || a.rank - b.rank
      );
      let previous: HTMLElement | null = null;
      for (const rank of sorted) {
        seen.add(rank.rank);
        const cell = this.cell(rank, hangRanks.has(rank.rank), run.balance);
        const wanted: ChildNode | null = previous
          ? previous.nextSibling
          : box.firstChild;
        if (cell.node !== wanted) {
          box.insertBefore(cell.node, wanted);
        }
        previous = cell.node;
      }
    }
    for (const [host, group] of this.groups) {
      if (!byHost.has(host)) {
        group.remove();
        this.groups.delete(host);
      }
    }
    for (const [id, cell] of this.cells) {
      if (!seen.has(id)) {
        cell.node.remove();
        this.cells.delete(id);
      }
    }
    this.pinned = this.pinned.filter(id => seen.has(id));
    if (this.opened !== null && !seen.has(this.opened)) {
      this.opened = null;
    }
    this.renderColumns(run, ranks, domains);
  }

  private renderFilters(ranks: GridRank[]): void {
    const counts: Record<string, number> = { all: ranks.length };
    ranks.forEach(
      rank =>
        (counts[statusGroup(rank.status)] =
          (counts[statusGroup(rank.status)] || 0) + 1)
    );
    const key = JSON.stringify([counts, this.filter]);
    if (this.filters.dataset.key === key) {
      return;
    }
    this.filters.dataset.key = key;
    const buttons = FILTERS.filter(
      name => name === 'all' || counts[name] || name === this.filter
    ).map(name => {
      const button = h(
        'button',
        'nl-grid-filter',
        `${name} ${counts[name] || 0}`
      );
      button.type = 'button';
      setData(button, {
        filter: name,
        active: name === this.filter ? 'true' : null
      });
      button.setAttribute('aria-pressed', String(name === this.filter));
      return button;
    });
    this.filters.replaceChildren(
      h('span', 'nl-grid-filters-label', 'show'),
      ...buttons
    );
  }

  private cell(
    rank: GridRank,
    inHang: boolean,
    balance: IBalance | null | undefined
  ): ICell {
    let cell = this.cells.get(rank.rank);
    if (!cell) {
      const node = h('div', 'nl-cell');
      node.tabIndex = 0;
      node.setAttribute('role', 'button');
      cell = { node, key: '' };
      this.cells.set(rank.rank, cell);
    }
    const group = statusGroup(rank.status);
    const lines = rank.lines || [];
    const lastLine = lines[lines.length - 1];
    const straggler =
      balance?.straggler === rank.rank ? stragglerLine(balance) : null;
    const hang =
      inHang || group === 'stuck'
        ? rank.status === 'stuck'
          ? 'stuck'
          : rank.status || 'stuck'
        : null;
    setData(cell.node, {
      rank: rank.rank,
      status: rank.status || 'unknown',
      group,
      trouble: TROUBLE.has(group) ? 'true' : null,
      hang,
      open: this.openRanks.includes(rank.rank) ? 'true' : null,
      pinned: this.pinned.includes(rank.rank) ? 'true' : null
    });
    cell.node.hidden = this.filter !== 'all' && this.filter !== group;
    const key = JSON.stringify([
      rank.rank,
      rank.status,
      rank.progress,
      lastLine?.n,
      lastLine?.text,
      straggler,
      hang
    ]);
    if (key !== cell.key) {
      cell.key = key;
      fillCell(cell.node, rank, lastLine?.text ?? '', straggler, hang);
    }
    return cell;
  }

  private renderColumns(
    run: IRun,
    ranks: GridRank[],
    domains: [string, IDomain | null][]
  ): void {
    const wanted = this.openRanks;
    for (const [id, column] of this.columns) {
      if (!wanted.includes(id)) {
        column.node.remove();
        this.columns.delete(id);
      }
    }
    let previous: HTMLElement | null = null;
    for (const id of wanted) {
      const rank = ranks.find(r => r.rank === id);
      if (!rank) {
        continue;
      }
      let column = this.columns.get(id);
      if (!column) {
        column = this.column(id);
        this.columns.set(id, column);
      }
      const pinned = this.pinned.includes(id);
      setData(column.node, { rank: id, pinned: pinned ? 'true' : null });
      column.pin.textContent = pinned ? 'unpin' : 'pin';
      column.pin.setAttribute('aria-pressed', String(pinned));
      const place: ChildNode | null = previous
        ? previous.nextSibling
        : this.openNode.firstChild;
      if (column.node !== place) {
        this.openNode.insertBefore(column.node, place);
      }
      previous = column.node;
      updateRank(column.view, rank, run, domains);
      if (column.view.pinned) {
        column.view.lines.scrollTop = column.view.lines.scrollHeight;
      }
    }
    this.openNode.hidden = this.columns.size === 0;
  }

  private column(id: number): IColumn {
    const node = h('div', 'nl-grid-column');
    const bar = h('div', 'nl-grid-column-bar');
    const pin = h('button', 'nl-pin', 'pin');
    const close = h('button', 'nl-close', 'close');
    pin.type = close.type = 'button';
    pin.addEventListener('click', () => this.pin(id));
    close.addEventListener('click', () => this.close(id));
    bar.append(pin, close);
    const view = createRankView();
    node.append(bar, view.node);
    return { node, pin, view };
  }
}

/** The balance's straggler line ("straggler: rank 3 (ranks 0, 1 waited 41% ...)"), the straggler mark's title. */
function stragglerLine(balance: IBalance): string {
  const line = (balance.summary || '')
    .split('\n')
    .find(text => text.startsWith('straggler'));
  return line || 'the rank the others wait for';
}

/** A cell's content: rank, status, step and bar, step time, straggler mark, hang badge, last line. */
function fillCell(
  node: HTMLElement,
  rank: GridRank,
  last: string,
  straggler: string | null,
  hang: string | null
): void {
  const progress = rank.progress;
  const top = h('div', 'nl-cell-top');
  top.append(
    h('span', 'nl-cell-rank', String(rank.rank)),
    h('span', 'nl-cell-status', rank.status || '')
  );
  if (hang) {
    top.appendChild(h('span', 'nl-cell-hang', hang));
  }
  if (straggler) {
    const mark = h('span', 'nl-cell-straggler', 'straggler');
    mark.title = straggler;
    top.appendChild(mark);
  }
  const step = h('div', 'nl-cell-step');
  if (progress && typeof progress.step === 'number') {
    step.textContent =
      typeof progress.total === 'number'
        ? `${progress.step}/${progress.total}`
        : `step ${progress.step}`;
    setData(step, { step: progress.step, total: progress.total });
  }
  const time = h(
    'span',
    'nl-cell-time',
    typeof progress?.step_time === 'number'
      ? `${formatNumber(progress.step_time)} s/step`
      : ''
  );
  step.appendChild(time);
  const bar = h('div', 'nl-cell-bar');
  const fraction = progressFraction(progress);
  bar.hidden = fraction === null;
  bar
    .appendChild(h('div', 'nl-cell-fill'))
    .setAttribute('style', `width: ${((fraction || 0) * 100).toFixed(1)}%`);
  const line = h('div', 'nl-cell-last', last);
  line.title = last;
  node.title = `rank ${rank.rank}${rank.host ? ` @ ${rank.host}` : ''}: ${rank.status || ''} (click to open its lines)`;
  node.replaceChildren(top, step, bar, line);
}
