/**
 * The Balance section: where each rank's time goes (`balance` in ../SCHEMA.md, computed by the kernel from the
 * ranks' `balance` events).
 *
 * One row per rank: a bar of computing against waiting for the others in collectives (over the steps every rank
 * has when the kernel used them, else over the whole function), the share waited, the median step time, and the
 * peak memory, as a bar against the GPU's memory when the rank has one. The straggler's row is marked, and so is
 * the kernel's summary line (the same text the plain display prints at the end). A legend says what each colour is.
 */

import { h, setData } from './dom';
import { formatNumber } from './format';
import type { IBalance, IBalanceRank } from './schema';

/** "2.3 GB", "512.0 MB". */
export function formatBytes(count: number | null | undefined): string {
  if (typeof count !== 'number' || !isFinite(count) || count < 0) {
    return '';
  }
  for (const [unit, size] of [
    ['GB', 1e9],
    ['MB', 1e6],
    ['KB', 1e3]
  ] as [string, number][]) {
    if (count >= size) {
      return `${(count / size).toFixed(1)} ${unit}`;
    }
  }
  return `${Math.round(count)} B`;
}

function share(rank: IBalanceRank): number | null {
  const value =
    typeof rank.step_wait_share === 'number'
      ? rank.step_wait_share
      : rank.wait_share;
  return typeof value === 'number' && isFinite(value)
    ? Math.max(0, Math.min(1, value))
    : null;
}

function bar(className: string, fraction: number, title: string): HTMLElement {
  const outer = h('span', `nl-balance-bar ${className}`);
  outer.title = title;
  const inner = h('span', 'nl-balance-fill');
  inner.style.width = `${(fraction * 100).toFixed(1)}%`;
  outer.appendChild(inner);
  return outer;
}

function renderRow(
  rank: string,
  figures: IBalanceRank,
  straggler: boolean
): HTMLElement {
  const row = h('div', 'nl-balance-rank');
  setData(row, { rank, straggler: straggler ? 'true' : null });
  row.appendChild(h('span', 'nl-balance-name', `rank ${rank}`));
  const waited = share(figures);
  if (waited !== null) {
    const percent = Math.round(waited * 100);
    row.appendChild(
      bar(
        'nl-balance-wait',
        waited,
        `computing ${100 - percent}%, waiting for the others ${percent}%`
      )
    );
    row.appendChild(h('span', 'nl-balance-share', `waited ${percent}%`));
  }
  if (typeof figures.step_time === 'number') {
    row.appendChild(
      h('span', 'nl-balance-step', `${formatNumber(figures.step_time)} s/step`)
    );
  }
  const peak = figures.peak_memory;
  if (typeof peak === 'number') {
    const total = figures.device_memory;
    if (typeof total === 'number' && total > 0) {
      const of = Math.min(1, peak / total);
      row.appendChild(
        bar(
          'nl-balance-memory',
          of,
          `peak ${formatBytes(peak)} of ${formatBytes(total)}`
        )
      );
      row.appendChild(
        h(
          'span',
          'nl-balance-peak',
          `${formatBytes(peak)} of ${formatBytes(total)}`
        )
      );
    } else {
      row.appendChild(
        h('span', 'nl-balance-peak', `peak ${formatBytes(peak)}`)
      );
    }
  }
  if (straggler) {
    row.appendChild(h('span', 'nl-badge nl-balance-straggler', 'straggler'));
  }
  return row;
}

/** What the bars' colours mean. */
function renderLegend(memory: boolean): HTMLElement {
  const legend = h('div', 'nl-balance-legend');
  const entries: [string, string][] = [
    ['nl-balance-key-compute', 'computing'],
    ['nl-balance-key-wait', 'waiting for the other ranks in collectives']
  ];
  if (memory) {
    entries.push(['nl-balance-key-memory', 'peak memory of the GPU']);
  }
  for (const [className, text] of entries) {
    const entry = h('span', 'nl-balance-key');
    entry.append(
      h('span', `nl-balance-swatch ${className}`),
      h('span', '', text)
    );
    legend.appendChild(entry);
  }
  return legend;
}

/** The section's children, or null when no rank has sent its figures yet. */
export function renderBalance(
  balance: IBalance | null | undefined
): Node[] | null {
  const ranks = Object.entries(balance?.ranks || {}).sort(
    ([a], [b]) => Number(a) - Number(b)
  );
  if (!balance || ranks.length === 0) {
    return null;
  }
  const title = h('div', 'nl-balance-title', 'Balance');
  title.appendChild(
    h('span', 'nl-balance-note', balance.final ? ' (final)' : ' (live)')
  );
  const nodes: Node[] = [
    title,
    renderLegend(
      ranks.some(([, figures]) => typeof figures?.device_memory === 'number')
    )
  ];
  const straggler =
    balance.straggler === null || balance.straggler === undefined
      ? null
      : String(balance.straggler);
  for (const [rank, figures] of ranks) {
    nodes.push(renderRow(rank, figures || {}, rank === straggler));
  }
  if (balance.summary) {
    nodes.push(h('pre', 'nl-balance-summary', balance.summary));
  }
  return nodes;
}
