import { describe, expect, it } from 'vitest';

import { formatBytes } from '../src/balance';
import { RunView } from '../src/renderer';
import type { IBalance } from '../src/schema';
import { rank, run } from './fixtures';

const XSS = '<img src=x onerror="window.__pwned = 1">';

function balance(extra: Partial<IBalance> = {}): IBalance {
  return {
    straggler: 1,
    final: false,
    ranks: {
      '0': {
        wait_share: 0.45,
        step_wait_share: 0.93,
        step_time: 0.054,
        peak_memory: 270e6,
        device_memory: null
      },
      '1': {
        wait_share: 0.01,
        step_wait_share: 0.02,
        step_time: 0.054,
        peak_memory: 479e6,
        device_memory: null
      }
    },
    summary:
      "straggler: rank 1 (rank 0 waited 93% of its steps' time for it; it waited 2%)",
    ...extra
  };
}

function render(state: IBalance | null, ranks = 2): HTMLElement {
  const view = new RunView();
  document.body.replaceChildren(view.node);
  view.update(
    run({
      balance: state,
      ranks: Array.from({ length: ranks }, (_, id) => rank(id))
    })
  );
  return view.node;
}

describe('the Balance section', () => {
  it('shows each rank computing against waiting, its step time and peak memory, the straggler marked', () => {
    const node = render(balance());
    const rows = [...node.querySelectorAll<HTMLElement>('.nl-balance-rank')];
    expect(rows.map(row => row.dataset.rank)).toEqual(['0', '1']);
    expect(rows[0].querySelector('.nl-balance-share')?.textContent).toBe(
      'waited 93%'
    ); // over the steps
    expect(
      (
        rows[0].querySelector(
          '.nl-balance-wait .nl-balance-fill'
        ) as HTMLElement
      ).style.width
    ).toBe('93%');
    expect(rows[1].querySelector('.nl-balance-peak')?.textContent).toBe(
      'peak 479.0 MB'
    );
    expect(rows[1].dataset.straggler).toBe('true');
    expect(rows[0].dataset.straggler).toBeUndefined();
    expect(node.querySelector('.nl-balance-note')?.textContent).toBe(' (live)');
    expect(node.querySelector('.nl-balance-summary')?.textContent).toContain(
      'straggler: rank 1'
    );
    expect(
      node.querySelector('.nl-rank[data-rank="1"] .nl-rank-straggler')
        ?.textContent
    ).toBe('straggler');
    expect(node.querySelectorAll('.nl-rank-straggler')).toHaveLength(1);
  });

  it("draws a GPU's peak against the device's memory", () => {
    const gpus = balance({
      straggler: null,
      summary: '',
      ranks: {
        '0': { wait_share: 0.1, peak_memory: 20e9, device_memory: 80e9 },
        '1': { wait_share: 0.1, peak_memory: 15e9, device_memory: 16e9 }
      }
    });
    const node = render(gpus);
    expect(
      node.querySelectorAll('.nl-balance-rank[data-straggler]')
    ).toHaveLength(0);
    const memory = node.querySelector(
      '.nl-balance-rank[data-rank="1"] .nl-balance-memory'
    ) as HTMLElement;
    expect(memory.title).toBe('peak 15.0 GB of 16.0 GB');
    expect(
      (memory.querySelector('.nl-balance-fill') as HTMLElement).style.width
    ).toBe('93.8%');
    expect(node.querySelector('.nl-balance-summary')).toBeNull();
  });

  it('is absent until a rank sends its figures, and never renders markup from them', () => {
    expect(render(null).querySelector('.nl-balance-rank')).toBeNull();
    expect(
      render(balance({ ranks: {} })).querySelector('.nl-balance-title')
    ).toBeNull();
    const hostile = render(balance({ summary: XSS, final: true }));
    expect(hostile.querySelector('img')).toBeNull();
    expect(hostile.querySelector('.nl-balance-summary')?.textContent).toBe(XSS);
    expect(hostile.querySelector('.nl-balance-note')?.textContent).toBe(
      ' (final)'
    );
  });

  it('formats byte counts as the kernel does', () => {
    expect([
      formatBytes(2.3e9),
      formatBytes(512e6),
      formatBytes(2048),
      formatBytes(12),
      formatBytes(-1)
    ]).toEqual(['2.3 GB', '512.0 MB', '2.0 KB', '12 B', '']);
  });
});
