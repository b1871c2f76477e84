import { describe, expect, it } from 'vitest';

import { RunView } from '../src/renderer';
import type { HangRankState, IHang } from '../src/schema';
import { rank, run } from './fixtures';

const XSS = '<img src=x onerror="window.__pwned = 1">';

function liveHang(extra: Partial<IHang> = {}): IHang {
  return {
    live: true,
    t: 40,
    quiet_s: 31.2,
    ranks: {
      '0': {
        state: 'in_ddp',
        text: "in DDP's gradient all_reduce (step 4) at train.py:31 in train"
      },
      '1': {
        state: 'waiting',
        text: 'waiting 31 s in barrier #1 at train.py:40 in train'
      }
    },
    diverged: 0,
    stacks: {
      '0': 'File "train.py", line 31 in train',
      '1': 'File "train.py", line 40 in train'
    },
    text: 'possible hang: no rank made progress for 31 s\n  rank 0: ...\n  rank 1: ...',
    cleared_after: null,
    cleared_t: null,
    cleared_text: null,
    ...extra
  };
}

const hangRanks = () => [
  rank(0, { status: 'in DDP' }),
  rank(1, { status: 'waiting' })
];

function render(
  view: RunView,
  hang: IHang | null,
  hangs: IHang[] = [],
  ranks = hangRanks()
): HTMLElement {
  document.body.replaceChildren(view.node);
  view.update(run({ hang, hangs, ranks }));
  return view.node;
}

function texts(root: ParentNode, selector: string): string[] {
  return [...root.querySelectorAll(selector)].map(
    node => node.textContent || ''
  );
}

describe('the hang card', () => {
  it('is at the top of the run while live, with each rank, who diverged and collapsed stacks', () => {
    const node = render(new RunView(), liveHang());
    const card = node.querySelector<HTMLElement>('.nl-hang')!;
    expect(node.querySelector('.nl-header')?.nextElementSibling).toBe(card);
    expect(card.dataset.live).toBe('true');
    expect(card.dataset.diverged).toBe('0');
    expect(card.querySelector('.nl-hang-label')?.textContent).toBe(
      'possible hang'
    );
    expect(card.querySelector('.nl-hang-live')?.textContent).toBe('live');
    expect(card.querySelector('.nl-hang-ending')).toBeNull();
    expect(card.querySelector('.nl-hang-title .nl-time')?.textContent).toBe(
      'at 40.0 s · 31 s without progress'
    );
    expect(card.querySelector('.nl-hang-summary')?.textContent).toBe(
      'no rank made progress for 31 s'
    );
    const items = [...card.querySelectorAll<HTMLElement>('.nl-hang-rank')];
    expect(
      items.map(i => [i.dataset.rank, i.dataset.state, i.dataset.diverged])
    ).toEqual([
      ['0', 'in_ddp', 'true'],
      ['1', 'waiting', undefined]
    ]);
    expect(texts(card, '.nl-hang-rank .nl-hang-state')).toEqual([
      'in DDP',
      'waiting'
    ]);
    expect(texts(card, '.nl-hang-text')[1]).toBe(
      'waiting 31 s in barrier #1 at train.py:40 in train'
    );
    expect(card.querySelector('.nl-hang-diverged')?.textContent).toContain(
      'rank 0 diverged'
    );
    const stacks = [
      ...card.querySelectorAll<HTMLDetailsElement>('details.nl-hang-stack')
    ];
    expect(stacks.map(s => [s.dataset.rank, s.open])).toEqual([
      ['0', false],
      ['1', false]
    ]);
    expect(stacks[1].querySelector('summary')?.textContent).toBe(
      "rank 1's stack"
    );
    expect(stacks[1].querySelector('pre')?.textContent).toBe(
      'File "train.py", line 40 in train'
    );
    expect(texts(node, '.nl-rank .nl-rank-status')).toEqual([
      'in DDP',
      'waiting'
    ]);
    expect(card.querySelector('.nl-hang-history')).toBeNull();
  });

  it('says how long it lasted once cleared, and keeps earlier notices in a collapsed history', () => {
    const view = new RunView();
    const cleared = liveHang({
      live: false,
      cleared_after: 6,
      cleared_t: 46,
      cleared_text: 'progress resumed after 6 s'
    });
    let node = render(view, cleared, [], [rank(0), rank(1)]);
    let card = node.querySelector<HTMLElement>('.nl-hang')!;
    expect(card.dataset.live).toBe('false');
    expect(card.querySelector('.nl-hang-live')).toBeNull();
    expect(card.querySelector('.nl-hang-ending')?.textContent).toBe(
      '(cleared after 6 s)'
    );
    expect(card.querySelector('.nl-hang-resumed')?.textContent).toBe(
      'progress resumed after 6 s'
    );
    expect(texts(node, '.nl-rank .nl-rank-status')).toEqual([
      'running',
      'running'
    ]);

    const earlier = { ...cleared, stacks: {}, stacks_dropped: 2 };
    node = render(view, liveHang({ t: 90 }), [earlier]);
    card = node.querySelector<HTMLElement>('.nl-hang')!;
    const history = card.querySelector<HTMLDetailsElement>(
      'details.nl-hang-history'
    )!;
    expect(history.open).toBe(false);
    expect(history.querySelector('summary')?.textContent).toBe(
      '1 earlier notice'
    );
    expect(history.querySelector('.nl-hang-earlier-title')?.textContent).toBe(
      'possible hang at 40.0 s · 31 s without progress (cleared after 6 s)'
    );
    expect(card.querySelectorAll('.nl-hang-card')).toHaveLength(1);
    expect(card.querySelector('.nl-hang-live')).not.toBeNull();
  });

  it('keeps the toggles the user opened across updates, and leaves the DOM when there is no notice', () => {
    const view = new RunView();
    let node = render(view, liveHang(), [
      liveHang({ live: false, cleared_after: 3 })
    ]);
    node.querySelector<HTMLDetailsElement>(
      'details.nl-hang-stack[data-rank="1"]'
    )!.open = true;
    node.querySelector<HTMLDetailsElement>('details.nl-hang-history')!.open =
      true;
    node = render(view, liveHang({ quiet_s: 45 }), [
      liveHang({ live: false, cleared_after: 3 })
    ]);
    expect(
      node.querySelector('.nl-hang-title .nl-time')?.textContent
    ).toContain('45 s without progress');
    expect(
      node.querySelector<HTMLDetailsElement>(
        'details.nl-hang-stack[data-rank="1"]'
      )!.open
    ).toBe(true);
    expect(
      node.querySelector<HTMLDetailsElement>(
        'details.nl-hang-stack[data-rank="0"]'
      )!.open
    ).toBe(false);
    expect(
      node.querySelector<HTMLDetailsElement>('details.nl-hang-history')!.open
    ).toBe(true);
    node = render(view, null, [], [rank(0), rank(1)]);
    expect(node.querySelector('.nl-hang')).toBeNull();
    render(view, liveHang({ live: false }), []);
    expect(node.querySelector('.nl-hang-ending')?.textContent).toBe(
      '(not cleared before the run ended)'
    );
  });

  it('renders user text as text', () => {
    const node = render(
      new RunView(),
      liveHang({
        ranks: { [XSS]: { state: XSS as HangRankState, text: XSS } },
        stacks: { '0': XSS },
        text: XSS,
        diverged: null
      }),
      [liveHang({ live: false, text: XSS, cleared_text: XSS })]
    );
    expect(node.querySelector('img')).toBeNull();
    expect(node.querySelector('.nl-hang-text')?.textContent).toBe(XSS);
    expect(node.querySelector('.nl-hang-diverged')).toBeNull();
  });

  it('is placed after a failure, which stays first', () => {
    const node = document.createElement('div');
    const view = new RunView();
    node.appendChild(view.node);
    view.update(
      run({
        status: 'hung',
        failure: { kind: 'hang', message: 'hung' },
        hang: liveHang({ live: false })
      })
    );
    const order = [...view.node.children].map(
      child => child.className.split(' ')[0]
    );
    expect(order.slice(0, 3)).toEqual(['nl-header', 'nl-failure', 'nl-hang']);
  });
});
