/**
 * One rank's column: head, progress bar, charts, "earlier lines" note and its box of lines, patched in place. The
 * panel shows one per rank up to 8 ranks; the grid (grid.ts) shows those of the ranks opened or pinned.
 */

import { IDomain, renderChart } from './chart';
import { badge, h, setData } from './dom';
import { formatNumber, formatProgress, progressFraction } from './format';
import { ILine, IRank, IRun } from './schema';

/** A rank column and what it last rendered. */
export interface IRankView {
  node: HTMLElement;
  head: HTMLElement;
  progress: HTMLElement;
  charts: HTMLElement;
  dropped: HTMLElement;
  lines: HTMLElement;
  /** `n` of each rendered line, in DOM order. */
  ns: number[];
  /** Whether the lines box follows new lines: true until the user scrolls up, again once back at the bottom. */
  pinned: boolean;
  keys: Map<string, string>;
}

/** Pixels from the bottom that still count as "at the bottom". */
const PIN_SLACK = 8;

function isAtBottom(node: HTMLElement): boolean {
  return node.scrollHeight - node.scrollTop - node.clientHeight <= PIN_SLACK;
}

/** Follow the user's scrolling; a box that is not laid out (hidden, detached) says nothing. */
function trackPin(view: IRankView): void {
  view.lines.addEventListener(
    'scroll',
    () => {
      if (view.lines.clientHeight > 0) {
        view.pinned = isAtBottom(view.lines);
      }
    },
    { passive: true }
  );
}

export function createRankView(): IRankView {
  const view: IRankView = {
    node: h('div', 'nl-rank'),
    head: h('div', 'nl-rank-head'),
    progress: h('div', 'nl-progress'),
    charts: h('div', 'nl-charts'),
    dropped: h('div', 'nl-dropped'),
    lines: h('div', 'nl-lines'),
    ns: [],
    pinned: true,
    keys: new Map()
  };
  view.node.append(
    view.head,
    view.progress,
    view.charts,
    view.dropped,
    view.lines
  );
  trackPin(view);
  return view;
}

/** Patch one rank column; each part is rebuilt only when its key changed. */
export function updateRank(
  view: IRankView,
  rank: IRank,
  run: IRun,
  domains: [string, IDomain | null][]
): void {
  const straggler = run.balance?.straggler === rank.rank;
  setData(view.node, {
    rank: rank.rank,
    status: rank.status || 'unknown',
    host: rank.host,
    straggler: straggler ? 'true' : null
  });
  const patch = (part: string, key: string, apply: () => void) => {
    if (view.keys.get(part) !== key) {
      view.keys.set(part, key);
      apply();
    }
  };
  const counts = levelCounts(rank.lines || []);
  patch(
    'head',
    JSON.stringify([
      rank.rank,
      rank.host,
      rank.status,
      rank.pid,
      rank.exit_code,
      straggler,
      counts
    ]),
    () => {
      const name = h(
        'span',
        'nl-rank-name',
        `rank ${rank.rank}${rank.host ? ` @ ${rank.host}` : ''}`
      );
      const meta = h(
        'span',
        'nl-rank-meta',
        [
          rank.pid ? `pid ${rank.pid}` : '',
          typeof rank.exit_code === 'number' ? `exit ${rank.exit_code}` : ''
        ]
          .filter(Boolean)
          .join(' · ')
      );
      view.head.replaceChildren(
        name,
        badge(rank.status, 'nl-rank-status'),
        meta
      );
      if (straggler) {
        view.head.appendChild(
          h('span', 'nl-badge nl-rank-straggler', 'straggler')
        );
      }
      for (const [level, count] of counts) {
        view.head.appendChild(countBadge(view, level, count));
      }
    }
  );
  patch('progress', JSON.stringify(rank.progress ?? null), () =>
    renderProgress(view.progress, rank)
  );
  const history = rank.history || [];
  const last = history[history.length - 1];
  patch(
    'charts',
    JSON.stringify([history.length, last?.t, last?.step, domains]),
    () => {
      view.charts.replaceChildren(
        ...domains
          .filter(([, d]) => d)
          .map(([series, d]) => renderChart(history, series, d as IDomain))
      );
      view.charts.hidden = view.charts.childElementCount === 0;
    }
  );
  const dropped = rank.lines_dropped || 0;
  patch('dropped', `${dropped}:${run.run_dir}`, () => {
    view.dropped.hidden = dropped <= 0;
    view.dropped.textContent =
      dropped > 0
        ? `${dropped} earlier ${dropped === 1 ? 'line is' : 'lines are'} in the run log: ${run.run_dir || '(run folder)'}`
        : '';
  });
  updateLines(view, rank.lines || []);
}

/** A line's level as its badge counts it: WARNING, ERROR (CRITICAL with it), or null. */
function countedLevel(line: ILine): string | null {
  const level = line.kind === 'log' ? (line.level || '').toUpperCase() : '';
  return level === 'WARNING'
    ? 'WARNING'
    : level === 'ERROR' || level === 'CRITICAL'
      ? 'ERROR'
      : null;
}

/** [[level, count]] of the rank's WARNING and ERROR log lines (those the column holds). */
export function levelCounts(lines: ILine[]): [string, number][] {
  const counts = new Map<string, number>();
  for (const line of lines) {
    const level = countedLevel(line);
    if (level) {
      counts.set(level, (counts.get(level) || 0) + 1);
    }
  }
  return (['WARNING', 'ERROR'] as const)
    .filter(level => counts.has(level))
    .map(level => [level, counts.get(level)!]);
}

/** "2 warnings": a click scrolls the column to the next such line (and stops following new lines). */
function countBadge(
  view: IRankView,
  level: string,
  count: number
): HTMLElement {
  const word = level === 'WARNING' ? 'warning' : 'error';
  const button = h(
    'button',
    'nl-badge nl-rank-count',
    `${count} ${word}${count === 1 ? '' : 's'}`
  );
  button.type = 'button';
  button.dataset.level = level;
  button.title = `show the next ${word} line of this rank`;
  let next = 0;
  button.addEventListener('click', () => {
    const found = [
      ...view.lines.querySelectorAll<HTMLElement>(
        `.nl-line[data-counted='${level}']`
      )
    ];
    if (!found.length) {
      return;
    }
    const line = found[next % found.length];
    next += 1;
    view.pinned = false;
    view.lines.scrollTop = line.offsetTop - view.lines.offsetTop - 8;
    view.lines
      .querySelectorAll('.nl-found')
      .forEach(node => node.classList.remove('nl-found'));
    line.classList.add('nl-found');
  });
  return button;
}

function renderProgress(node: HTMLElement, rank: IRank): void {
  const progress = rank.progress;
  node.hidden = !progress;
  if (!progress) {
    node.replaceChildren();
    return;
  }
  const fraction = progressFraction(progress);
  setData(node, { step: progress.step, total: progress.total });
  const bar = h('div', 'nl-progress-bar');
  const fill = bar.appendChild(h('div', 'nl-progress-fill'));
  fill.style.width =
    fraction === null ? '100%' : `${(fraction * 100).toFixed(1)}%`;
  bar.classList.toggle('nl-indeterminate', fraction === null);
  node.replaceChildren(
    bar,
    h('div', 'nl-progress-text', formatProgress(progress))
  );
}

/**
 * Lines are identified by `n`. The payload holds a sliding window (newest lines), so: drop rendered lines
 * older than the window, check the rest are a prefix of it, append the new ones. Anything else (a new
 * attempt restarting the numbering) falls back to a full rebuild.
 */
function updateLines(view: IRankView, lines: ILine[]): void {
  const first = lines.length ? lines[0].n : Infinity;
  let drop = 0;
  while (drop < view.ns.length && view.ns[drop] < first) {
    drop++;
  }
  let prefix = view.ns.length - drop <= lines.length;
  for (let i = drop; prefix && i < view.ns.length; i++) {
    prefix = view.ns[i] === lines[i - drop].n;
  }
  if (!prefix) {
    view.lines.replaceChildren();
    view.ns = [];
    drop = 0;
  }
  for (let i = 0; i < drop; i++) {
    view.lines.firstChild?.remove();
  }
  view.ns.splice(0, drop);
  const fresh = lines.slice(view.ns.length);
  if (fresh.length) {
    const fragment = document.createDocumentFragment();
    fresh.forEach(line => fragment.appendChild(renderLine(line)));
    view.lines.appendChild(fragment);
    view.ns.push(...fresh.map(line => line.n));
  }
}

/**
 * `div.nl-line[data-kind][data-level]`: level and logger name first for log records; `retry` (an out-of-memory
 * retry, amber) and `attempt` (the divider where a new attempt starts) are the kernel's own lines.
 */
function renderLine(line: ILine): HTMLElement {
  const kind = line.kind || 'stdout';
  const node = h('div', 'nl-line');
  setData(node, {
    n: line.n,
    kind,
    level: kind === 'log' ? (line.level || 'INFO').toUpperCase() : null,
    counted: countedLevel(line)
  });
  if (typeof line.t === 'number') {
    node.title = `${formatNumber(line.t)} s after the start`;
  }
  if (kind === 'log') {
    node.appendChild(
      h('span', 'nl-level', (line.level || 'INFO').toUpperCase())
    );
    if (line.logger) {
      node.appendChild(h('span', 'nl-logger', line.logger));
    }
  }
  node.appendChild(h('span', 'nl-text', line.text ?? ''));
  return node;
}
