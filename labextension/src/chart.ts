/**
 * Small hand-written SVG line charts for one rank's history. All ranks of a run share one domain per
 * series, so a straggler (higher step_time, lagging metric) stands out when columns are compared.
 */

import { h, s } from './dom';
import { formatNumber } from './format';
import type { IHistoryPoint, IRank } from './schema';

export const STEP_TIME = 'step_time';

const WIDTH = 120;
const HEIGHT = 32;

export interface IDomain {
  x0: number;
  x1: number;
  y0: number;
  y1: number;
}

/** The value of a series at one history point (a metric name or `step_time`), or null. */
export function pick(point: IHistoryPoint, series: string): number | null {
  const value =
    series === STEP_TIME ? point.step_time : point.metrics?.[series];
  return typeof value === 'number' && isFinite(value) ? value : null;
}

/** x of a point: time since the start if known, else the step. */
function xOf(point: IHistoryPoint): number | null {
  const x = typeof point.t === 'number' ? point.t : point.step;
  return typeof x === 'number' && isFinite(x) ? x : null;
}

/** The metric to chart: `loss` if reported, else the first metric name in alphabetical order. */
export function chartMetric(ranks: IRank[]): string | null {
  const names = new Set<string>();
  for (const rank of ranks) {
    for (const point of rank.history || []) {
      Object.keys(point.metrics || {}).forEach(name => names.add(name));
    }
  }
  if (names.has('loss')) {
    return 'loss';
  }
  return [...names].sort()[0] ?? null;
}

/** The shared domain of one series over all ranks, or null when no rank has a value. */
export function seriesDomain(ranks: IRank[], series: string): IDomain | null {
  let domain: IDomain | null = null;
  for (const rank of ranks) {
    for (const point of rank.history || []) {
      const x = xOf(point);
      const y = pick(point, series);
      if (x === null || y === null) {
        continue;
      }
      if (!domain) {
        domain = { x0: x, x1: x, y0: y, y1: y };
      } else {
        domain.x0 = Math.min(domain.x0, x);
        domain.x1 = Math.max(domain.x1, x);
        domain.y0 = Math.min(domain.y0, y);
        domain.y1 = Math.max(domain.y1, y);
      }
    }
  }
  return domain;
}

/** `div.nl-chart-box` with a label (series and latest value) and `svg.nl-chart[data-series]`. */
export function renderChart(
  history: IHistoryPoint[],
  series: string,
  domain: IDomain
): HTMLElement {
  const box = h('div', 'nl-chart-box');
  const coords: string[] = [];
  let last: number | null = null;
  const dx = domain.x1 - domain.x0 || 1;
  const dy = domain.y1 - domain.y0 || 1;
  for (const point of history) {
    const x = xOf(point);
    const y = pick(point, series);
    if (x === null || y === null) {
      continue;
    }
    last = y;
    const px = ((x - domain.x0) / dx) * WIDTH;
    const py = HEIGHT - 1 - ((y - domain.y0) / dy) * (HEIGHT - 2);
    coords.push(`${px.toFixed(1)},${py.toFixed(1)}`);
  }
  const label = h('span', 'nl-chart-label');
  label.appendChild(h('span', 'nl-chart-name', series));
  label.appendChild(
    h('span', 'nl-chart-value', last === null ? '–' : formatNumber(last))
  );
  box.appendChild(label);

  const svg = s('svg', {
    class: 'nl-chart',
    viewBox: `0 0 ${WIDTH} ${HEIGHT}`,
    preserveAspectRatio: 'none',
    role: 'img'
  });
  svg.dataset.series = series;
  svg.dataset.points = String(coords.length);
  const title = s('title');
  title.textContent = `${series} over time (shared scale across ranks: ${formatNumber(domain.y0)} to ${formatNumber(domain.y1)})`;
  svg.appendChild(title);
  if (coords.length === 1) {
    coords.push(`${WIDTH},${coords[0].split(',')[1]}`);
  }
  if (coords.length > 0) {
    svg.appendChild(
      s('polyline', { points: coords.join(' '), class: 'nl-chart-line' })
    );
  }
  box.appendChild(svg);
  return box;
}
