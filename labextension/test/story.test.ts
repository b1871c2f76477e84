import { afterEach, beforeEach, describe, expect, it, vi } from 'vitest';

import { RunView } from '../src/renderer';
import type { IHang, IRun } from '../src/schema';
import { line, rank, run } from './fixtures';

function texts(root: ParentNode, selector: string): string[] {
  return [...root.querySelectorAll(selector)].map(
    node => node.textContent || ''
  );
}

function show(state: IRun, view = new RunView()): HTMLElement {
  document.body.replaceChildren(view.node);
  view.update(state);
  return view.node;
}

/** A live notice as the kernel's state has it: noticed at 12 s, no progress since 7 s, timeout=30 s at 30.5 s. */
function liveHang(): IHang {
  return {
    live: true,
    t: 12,
    quiet_s: 5,
    notice_t: 12,
    quiet_since_t: 7,
    timeout: 30,
    timeout_t: 30.5,
    verdict:
      'ranks wait in different collectives: rank 0 in all_reduce #6, rank 1 in barrier #6.',
    ranks: {
      '0': {
        state: 'waiting',
        text: 'waiting 5 s in all_reduce #6 at cell In[4], line 8',
        since_t: 7
      },
      '1': {
        state: 'waiting',
        text: 'waiting 4 s in barrier #6 at cell In[4], line 10',
        since_t: 8
      }
    },
    diverged: null,
    stacks: {},
    text: 'possible hang: no rank has made progress for 5 s'
  };
}

describe('the live hang card', () => {
  beforeEach(() => vi.useFakeTimers());
  afterEach(() => vi.useRealTimers());

  it('has the verdict as its title, and its counters and countdown move on between updates', () => {
    const node = show(
      run({ status: 'running', elapsed: 12, hang: liveHang() })
    );
    const card = node.querySelector<HTMLElement>('.nl-hang')!;
    expect(card.querySelector('.nl-hang-verdict')?.textContent).toBe(
      'Ranks wait in different collectives: rank 0 in all_reduce #6, rank 1 in barrier #6'
    );
    expect(card.querySelector('.nl-hang-when')?.textContent).toBe(
      'at 12.0 s · 5 s without progress'
    );
    expect(texts(card, '.nl-hang-text')[0]).toBe(
      'waiting 5 s in all_reduce #6 at cell In[4], line 8'
    );
    expect(card.querySelector('.nl-hang-timeout')?.textContent).toBe(
      'timeout=30 s will stop it in 19 s; press stop to end it sooner'
    );
    vi.advanceTimersByTime(3000); // no update from the kernel: the panel's clock alone
    expect(card.querySelector('.nl-hang-when')?.textContent).toBe(
      'at 12.0 s · 8 s without progress'
    );
    expect(texts(card, '.nl-hang-text')).toEqual([
      'waiting 8 s in all_reduce #6 at cell In[4], line 8',
      'waiting 7 s in barrier #6 at cell In[4], line 10'
    ]);
    expect(card.querySelector('.nl-hang-timeout')?.textContent).toBe(
      'timeout=30 s will stop it in 16 s; press stop to end it sooner'
    );
  });

  it('says the run waits for the stop button without timeout=, and stops counting once not live', () => {
    const view = new RunView();
    let node = show(
      run({
        elapsed: 12,
        hang: { ...liveHang(), timeout: null, timeout_t: null }
      }),
      view
    );
    expect(node.querySelector('.nl-hang-timeout')?.textContent).toContain(
      'no timeout= is set'
    );
    node = show(
      run({
        status: 'timed out',
        elapsed: 31,
        hang: { ...liveHang(), live: false }
      }),
      view
    );
    vi.advanceTimersByTime(3000);
    expect(node.querySelector('.nl-hang-timeout')).toBeNull();
    expect(node.querySelector('.nl-hang-when')?.textContent).toBe(
      'at 12.0 s · 5 s without progress'
    );
  });
});

describe('the failure card', () => {
  it('is titled with its verdict, and tells the traceback, the rest and each stack once', () => {
    const node = show(
      run({
        status: 'failed',
        failure: {
          kind: 'failure',
          rank: 1,
          type: 'ValueError',
          verdict: 'Rank 1 failed first: ValueError: bad value on rank 1',
          traceback:
            'Traceback (most recent call last):\n  File "cell In[4], line 8", in train\nValueError: bad value on rank 1',
          message:
            'Other ranks:\n  rank 0: stopped by the launcher\n\nRun log: /tmp/runs/x',
          stacks: null
        }
      })
    );
    const card = node.querySelector('.nl-failure')!;
    expect(card.querySelector('.nl-failure-title')?.textContent).toBe(
      'Rank 1 failed first: ValueError: bad value on rank 1'
    );
    expect(
      texts(card, 'pre').join('\n').split('bad value on rank 1')
    ).toHaveLength(2); // once under the title
    expect(card.querySelector('.nl-label')).toBeNull();
  });

  it('is titled with a timeout’s verdict, not "Timed out"', () => {
    const node = show(
      run({
        status: 'timed out',
        failure: {
          kind: 'timeout',
          verdict:
            'The run did not finish within timeout=30 s, so every rank was stopped.\nThe ranks stopped making progress.',
          message: 'rank 0: waiting 29.8 s in all_reduce #6',
          stacks: { '0': 'File "cell In[4], line 8" in train' }
        }
      })
    );
    expect(node.querySelector('.nl-failure-title')?.textContent).toBe(
      'The run did not finish within timeout=30 s, so every rank was stopped. The ranks stopped making progress.'
    );
    expect(texts(node, '.nl-failure .nl-stack .nl-label')).toEqual([
      "rank 0's Python stack"
    ]);
  });
});

describe('the rank columns', () => {
  it('show an out-of-memory retry as a retry and a divider where each attempt starts; "attempt" only past 1', () => {
    const retried = [
      line(1, 'training at 64'),
      line(2, 'out of memory at batch size 64: retried at batch size 32', {
        kind: 'retry'
      }),
      line(3, 'attempt 2 at batch size 32', { kind: 'attempt' }),
      line(4, 'training at 32')
    ];
    let node = show(run({ attempt: 2, ranks: [rank(0, { lines: retried })] }));
    expect(texts(node, ".nl-line[data-kind='retry']")).toEqual([
      'out of memory at batch size 64: retried at batch size 32'
    ]);
    expect(texts(node, ".nl-line[data-kind='attempt']")).toEqual([
      'attempt 2 at batch size 32'
    ]);
    expect(node.querySelector("[data-field='attempt']")?.textContent).toBe(
      'attempt 2'
    );
    node = show(run({ attempt: 1 }));
    expect(node.querySelector("[data-field='attempt']")).toBeNull();
  });

  it('count each rank’s WARNING and ERROR lines in its head, and a click scrolls to the next one', () => {
    const lines = [
      line(1, 'start'),
      line(2, 'careful', { kind: 'log', level: 'WARNING' }),
      line(3, 'step 450 broke', { kind: 'log', level: 'ERROR' }),
      line(4, 'careful again', { kind: 'log', level: 'WARNING' }),
      line(5, 'end')
    ];
    const node = show(run({ ranks: [rank(0, { lines }), rank(1)] }));
    const [first, second] = [...node.querySelectorAll('.nl-rank')];
    expect(texts(first, '.nl-rank-count')).toEqual(['2 warnings', '1 error']);
    expect(second.querySelector('.nl-rank-count')).toBeNull();
    const warnings = first.querySelector<HTMLButtonElement>(
      ".nl-rank-count[data-level='WARNING']"
    )!;
    warnings.click();
    expect(texts(first, '.nl-found')).toEqual(['WARNINGcareful']);
    warnings.click();
    expect(texts(first, '.nl-found')).toEqual(['WARNINGcareful again']);
    first
      .querySelector<HTMLButtonElement>(".nl-rank-count[data-level='ERROR']")!
      .click();
    expect(texts(first, '.nl-found')).toEqual(['ERRORstep 450 broke']);
  });
});

describe('the live balance', () => {
  it('has a legend for its bar colours', () => {
    const node = show(
      run({
        balance: {
          final: false,
          ranks: { '0': { wait_share: 0.4 }, '1': { wait_share: 0.1 } }
        }
      })
    );
    expect(texts(node, '.nl-balance-rank .nl-balance-name')).toEqual([
      'rank 0',
      'rank 1'
    ]);
    expect(texts(node, '.nl-balance-legend .nl-balance-key')).toEqual([
      'computing',
      'waiting for the other ranks in collectives'
    ]);
  });
});
