/**
 * The hang card: what the kernel's watchdog noticed (`hang` and `hangs` in ../SCHEMA.md), at the top of the run.
 *
 * While the notice is live its title is the verdict (which ranks wait where, which diverged) with a pulsing "live"
 * marker, and its counters move on by the panel's own clock between updates (`tick`): the seconds without
 * progress, each rank's seconds waiting, and the countdown to `timeout=`. Once progress resumes it
 * says how long the hang lasted and stays (not live) until the next notice, which moves it to the collapsed
 * history below. Each rank's place is one line with its state as a badge; the rank that diverged (not in the
 * collective the others wait in) is marked; each rank's stack is collapsed under its own toggle. The card is
 * rebuilt only when its data changed, and toggles the user opened stay open across updates.
 */

import { badge, h, setData } from './dom';
import { formatElapsed, formatNumber } from './format';
import type { IHang, IHangRank } from './schema';

/** A notice's rank state as the badge shows it (the same words as the rank's status badge). */
export function hangBadge(state: string | undefined): string {
  return state === 'in_ddp' ? 'in DDP' : state || 'unknown';
}

/** "(cleared after 6 s)", or why a notice that is not live ended. */
export function hangEnding(hang: IHang): string {
  if (typeof hang.cleared_after === 'number') {
    return `(cleared after ${Math.round(hang.cleared_after)} s)`;
  }
  return typeof hang.cleared_t === 'number'
    ? '(cleared)'
    : '(not cleared before the run ended)';
}

/** "at 40.0 s · 31 s without progress" (`now`: the run's elapsed seconds, for a live notice's count). */
function hangWhen(hang: IHang, now?: number): string {
  const parts: string[] = [];
  if (typeof hang.t === 'number') {
    parts.push(`at ${formatElapsed(hang.t)}`);
  }
  const quiet = quietSeconds(hang, now);
  if (quiet !== null) {
    parts.push(`${quiet} s without progress`);
  }
  return parts.join(' · ');
}

/** Whole seconds since `since` at `now`, never below `floor` (what the kernel last said). */
function secondsSince(
  since: number | null | undefined,
  now: number | undefined,
  floor: number | null
): number | null {
  if (typeof since === 'number' && typeof now === 'number' && isFinite(now)) {
    return Math.max(Math.round(now - since), Math.round(floor ?? 0));
  }
  return floor === null ? null : Math.round(floor);
}

function quietSeconds(hang: IHang, now?: number): number | null {
  const said = typeof hang.quiet_s === 'number' ? hang.quiet_s : null;
  return hang.live
    ? secondsSince(hang.quiet_since_t, now, said)
    : said === null
      ? null
      : Math.round(said);
}

/** A waiting rank's line with its seconds moved on: "waiting 12 s in all_reduce #6 at ...". */
export function rankText(
  place: IHangRank,
  live: boolean,
  now?: number
): string {
  const text = place.text || '';
  const waited = live ? secondsSince(place.since_t, now, null) : null;
  return waited === null
    ? text
    : text.replace(/^waiting \d+ s /, `waiting ${waited} s `);
}

/** "timeout=30 s will stop it in 12 s; press stop to end it sooner", or what happens without a timeout. */
export function countdown(hang: IHang, now?: number): string {
  if (typeof hang.timeout !== 'number') {
    return 'no timeout= is set: the run waits until you press stop (interrupt)';
  }
  const limit = `timeout=${formatNumber(hang.timeout)} s`;
  if (typeof hang.timeout_t !== 'number' || typeof now !== 'number') {
    return `${limit} will stop it; press stop to end it sooner`;
  }
  const left = Math.max(0, Math.round(hang.timeout_t - now));
  return `${limit} will stop it in ${left} s; press stop to end it sooner`;
}

function byRank<T>(record: Record<string, T> | undefined): [string, T][] {
  return Object.entries(record || {}).sort(([a], [b]) => Number(a) - Number(b));
}

/** The notice's first line without its "possible hang:" (the title says it already). */
function summary(text: string | undefined): string {
  const first = (text || '').split('\n', 1)[0];
  return first.replace(/^\s*possible hang\s*:?\s*/i, '').trim();
}

/** A collapsed toggle, open again if the user had opened it before an update. */
function toggle(
  key: string,
  title: string,
  open: Set<string>,
  className: string
): HTMLDetailsElement {
  const details = h('details', className);
  details.dataset.key = key;
  details.open = open.has(key);
  details.appendChild(h('summary', 'nl-hang-toggle', title));
  return details;
}

function renderRank(
  rank: string,
  place: IHangRank,
  diverged: boolean,
  live: boolean,
  now?: number
): HTMLElement {
  const item = h('li', 'nl-hang-rank');
  setData(item, {
    rank,
    state: place.state || 'unknown',
    diverged: diverged ? 'true' : null
  });
  item.append(
    h('span', 'nl-hang-rank-name', `rank ${rank}`),
    badge(hangBadge(place.state), 'nl-hang-state')
  );
  item.appendChild(h('span', 'nl-hang-text', rankText(place, live, now)));
  if (diverged) {
    item.appendChild(h('span', 'nl-hang-diverged-tag', 'diverged'));
  }
  return item;
}

/** The verdict as a title: "Ranks wait in different collectives: rank 0 in all_reduce #6, rank 1 in barrier #6". */
function verdictTitle(hang: IHang): string {
  const verdict = (hang.verdict || '').trim().replace(/\.$/, '');
  return verdict ? verdict.charAt(0).toUpperCase() + verdict.slice(1) : '';
}

/** The newest notice: title (its verdict), when, each rank's line, who diverged, the countdown, the stacks. */
function renderNotice(
  hang: IHang,
  open: Set<string>,
  now?: number
): HTMLElement {
  const card = h('div', 'nl-hang-card nl-card');
  const title = h('div', 'nl-card-title nl-hang-title');
  title.appendChild(h('span', 'nl-hang-label', 'possible hang'));
  const verdict = verdictTitle(hang);
  if (verdict) {
    title.appendChild(h('span', 'nl-hang-verdict', verdict));
  }
  if (hang.live) {
    title.appendChild(h('span', 'nl-hang-live', 'live'));
  } else {
    title.appendChild(h('span', 'nl-hang-ending', hangEnding(hang)));
  }
  const when = hangWhen(hang, now);
  if (when) {
    title.appendChild(h('span', 'nl-time nl-hang-when', when));
  }
  card.appendChild(title);
  const said = summary(hang.text);
  if (said && !verdict) {
    card.appendChild(h('div', 'nl-hang-summary', said));
  }
  const ranks = byRank(hang.ranks);
  const diverged =
    typeof hang.diverged === 'number' ? String(hang.diverged) : null;
  if (ranks.length) {
    const list = h('ul', 'nl-hang-ranks');
    ranks.forEach(([rank, place]) =>
      list.appendChild(
        renderRank(rank, place || {}, rank === diverged, !!hang.live, now)
      )
    );
    card.appendChild(list);
  } else if (hang.text && hang.text.includes('\n')) {
    card.appendChild(
      h(
        'pre',
        'nl-hang-text-block',
        hang.text.slice(hang.text.indexOf('\n') + 1)
      )
    );
  }
  if (diverged !== null && !verdict) {
    card.appendChild(
      h(
        'div',
        'nl-hang-diverged',
        `rank ${diverged} diverged: it is not in the collective the other ranks wait in`
      )
    );
  }
  if (hang.live) {
    card.appendChild(h('div', 'nl-hang-timeout', countdown(hang, now)));
  }
  for (const [rank, stack] of byRank(hang.stacks)) {
    const details = toggle(
      `stack-${rank}`,
      `rank ${rank}'s stack`,
      open,
      'nl-hang-stack'
    );
    details.dataset.rank = rank;
    details.appendChild(h('pre', 'nl-stack-text', stack));
    card.appendChild(details);
  }
  if (!hang.live && hang.cleared_text) {
    card.appendChild(h('div', 'nl-hang-resumed', hang.cleared_text));
  }
  return card;
}

/** Earlier notices, newest first, in one collapsed toggle. */
function renderHistory(hangs: IHang[], open: Set<string>): HTMLElement {
  const count = hangs.length;
  const details = toggle(
    'history',
    `${count} earlier ${count === 1 ? 'notice' : 'notices'}`,
    open,
    'nl-hang-history'
  );
  for (const hang of [...hangs].reverse()) {
    const item = h('div', 'nl-hang-earlier');
    setData(item, { t: hang.t });
    item.appendChild(
      h(
        'div',
        'nl-hang-earlier-title',
        `possible hang ${hangWhen(hang)} ${hangEnding(hang)}`.trim()
      )
    );
    if (hang.text) {
      item.appendChild(h('pre', 'nl-hang-text-block', hang.text));
    }
    if (hang.stacks_dropped) {
      item.appendChild(h('div', 'nl-time', 'its stacks are in the run log'));
    }
    details.appendChild(item);
  }
  return details;
}

/** The card's section; `update` says whether there is anything to show, `tick` moves a live card's counters. */
export class HangCard {
  readonly node = h('section', 'nl-hang');
  private key = '';
  private hang: IHang | null = null;

  /** The run's elapsed seconds now, by the panel's clock: the counters of a live notice move on. */
  tick(now: number): void {
    const hang = this.hang;
    if (!hang || !hang.live) {
      return;
    }
    const when = this.node.querySelector('.nl-hang-when');
    if (when) {
      when.textContent = hangWhen(hang, now);
    }
    this.node.querySelectorAll<HTMLElement>('.nl-hang-rank').forEach(item => {
      const place = (hang.ranks || {})[item.dataset.rank || ''];
      const text = item.querySelector('.nl-hang-text');
      if (place && text) {
        text.textContent = rankText(place, true, now);
      }
    });
    const timeout = this.node.querySelector('.nl-hang-timeout');
    if (timeout) {
      timeout.textContent = countdown(hang, now);
    }
  }

  update(
    hang: IHang | null | undefined,
    hangs: IHang[] | undefined,
    now?: number
  ): boolean {
    this.hang = hang || null;
    const earlier = hangs || [];
    setData(this.node, {
      live: hang ? String(!!hang.live) : null,
      diverged: typeof hang?.diverged === 'number' ? hang.diverged : null
    });
    const key = JSON.stringify([hang ?? null, earlier]);
    if (key !== this.key) {
      this.key = key;
      const open = new Set<string>();
      this.node
        .querySelectorAll<HTMLDetailsElement>('details[open]')
        .forEach(d => open.add(d.dataset.key || ''));
      const parts: Node[] = [];
      if (hang) {
        parts.push(renderNotice(hang, open, now));
      }
      if (earlier.length) {
        parts.push(renderHistory(earlier, open));
      }
      this.node.replaceChildren(...parts);
    } else if (typeof now === 'number') {
      this.tick(now);
    }
    return !!hang || earlier.length > 0;
  }
}
