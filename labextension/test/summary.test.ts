import { describe, expect, it } from 'vitest';

import { RunView } from '../src/renderer';
import { rank, run } from './fixtures';

const XSS = '<img src=x onerror="window.__pwned = 1">';

describe('the summary header', () => {
  it('shows the verdict first, a row per rank and how to open the whole log, as text', () => {
    const view = new RunView();
    document.body.replaceChildren(view.node);
    view.update(
      run({
        summary: {
          verdict: 'hang',
          title: 'Possible hang: 12 s without progress',
          detail: ['rank 0: waiting 12 s in all_reduce #6'],
          balance: 'balanced: no straggler',
          inspect: 'inspect_run("r")'
        },
        ranks: [
          rank(0, {
            status: 'waiting',
            summary: {
              step: '6/10',
              speed: '0.05 s/step',
              warnings: 2,
              last: XSS
            }
          }),
          rank(1, { status: 'busy', summary: {} })
        ]
      })
    );
    const box = view.node.querySelector(
      '.nl-header .nl-summary'
    ) as HTMLElement;
    expect(box.dataset.verdict).toBe('hang');
    expect(box.querySelector('.nl-summary-title')?.textContent).toBe(
      'Possible hang: 12 s without progress'
    );
    const rows = [...box.querySelectorAll('tbody tr')].map(row =>
      [...row.querySelectorAll('td')].map(cell => cell.textContent)
    );
    expect(rows).toEqual([
      ['0', 'waiting', '6/10', '0.05', '', '2', '0', XSS],
      ['1', 'busy', '', '', '', '0', '0', '']
    ]);
    expect(box.querySelector('img')).toBeNull();
    expect(box.querySelector('.nl-summary-foot')?.textContent).toBe(
      'balanced: no straggler · whole log: inspect_run("r")'
    );
  });

  it('leaves the verdict to the card that tells it, and the balance to the Balance section', () => {
    const view = new RunView();
    document.body.replaceChildren(view.node);
    view.update(
      run({
        status: 'failed',
        summary: {
          verdict: 'failed',
          title: 'Failed: rank 1 raised ValueError: bad',
          detail: ['rank 1: ValueError: bad'],
          balance: 'straggler: rank 1',
          inspect: 'inspect_run("r")'
        },
        failure: {
          kind: 'failure',
          rank: 1,
          type: 'ValueError',
          verdict: 'Rank 1 failed first: ValueError: bad'
        },
        balance: {
          straggler: 1,
          final: true,
          ranks: {},
          summary: 'straggler: rank 1'
        },
        ranks: [rank(0, { status: 'stopped' }), rank(1, { status: 'failed' })]
      } as any)
    );
    const box = view.node.querySelector(
      '.nl-header .nl-summary'
    ) as HTMLElement;
    expect(box.querySelector('.nl-summary-title')).toBeNull();
    expect(box.querySelector('.nl-summary-detail')).toBeNull();
    expect(box.querySelectorAll('tbody tr').length).toBe(2);
    expect(box.querySelector('.nl-summary-foot')?.textContent).toBe(
      'whole log: inspect_run("r")'
    );
    expect(
      view.node.textContent?.split('Rank 1 failed first: ValueError: bad')
        .length
    ).toBe(2);
  });
});
