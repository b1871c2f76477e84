import { describe, expect, it } from 'vitest';

import { MAX_PINNED } from '../src/grid';
import { GRID_ABOVE, RunView } from '../src/renderer';
import { IRank } from '../src/schema';
import { line, rank, run } from './fixtures';

function ranks(
  count: number,
  extra: (id: number) => Partial<IRank> = () => ({})
): IRank[] {
  return Array.from({ length: count }, (_, id) =>
    rank(id, {
      lines: [
        line(id * 10 + 1, `first ${id}`),
        line(id * 10 + 2, `last ${id}`)
      ],
      lines_total: 2,
      progress: { step: id, total: 40, step_time: 0.05, metrics: {} },
      ...extra(id)
    })
  );
}

function render(
  count: number,
  extra?: (id: number) => Partial<IRank>,
  more = {}
): RunView {
  const view = new RunView();
  document.body.replaceChildren(view.node);
  view.update(
    run({
      num_processes: count,
      world_size: count,
      ranks: ranks(count, extra),
      ...more
    })
  );
  return view;
}

function cellRanks(view: RunView, selector = '.nl-cell'): string[] {
  return [...view.node.querySelectorAll<HTMLElement>(selector)]
    .filter(c => !c.hidden)
    .map(c => c.dataset.rank!);
}

function click(node: Element | null): void {
  (node as HTMLElement).dispatchEvent(
    new MouseEvent('click', { bubbles: true })
  );
}

describe('the rank grid', () => {
  it('shows one cell per rank above 8 ranks, with step, step time and last line, and no columns', () => {
    const view = render(32);
    expect(view.node.querySelectorAll('.nl-cell')).toHaveLength(32);
    expect(view.node.querySelectorAll('.nl-rank')).toHaveLength(0);
    const cell = view.node.querySelector('.nl-cell[data-rank="5"]')!;
    expect(cell.querySelector('.nl-cell-last')?.textContent).toBe('last 5');
    expect(cell.querySelector('.nl-cell-step')?.textContent).toBe(
      '5/400.05 s/step'
    );
    expect(render(GRID_ABOVE).node.querySelectorAll('.nl-cell')).toHaveLength(
      0
    ); // 8: columns, as before
  });

  it('puts failed and stuck ranks first and marks them, groups ranks by host', () => {
    const status = (id: number) =>
      id === 20 ? 'failed' : id === 7 ? 'waiting' : 'running';
    const view = render(16, id => ({
      status: status(id + (id >= 8 ? 12 : 0)),
      host: id < 8 ? 'node-a' : 'node-b'
    }));
    const groups = [
      ...view.node.querySelectorAll<HTMLElement>('.nl-grid-host')
    ].map(g => g.dataset.host);
    expect(groups).toEqual(['node-a', 'node-b']);
    const b = view.node.querySelectorAll('.nl-grid-host')[1];
    expect(
      [...b.querySelectorAll<HTMLElement>('.nl-cell')].map(c => c.dataset.rank)
    ).toEqual(['8', '9', '10', '11', '12', '13', '14', '15']);
    const a = view.node.querySelectorAll('.nl-grid-host')[0];
    expect(
      [...a.querySelectorAll<HTMLElement>('.nl-cell')][0].dataset.rank
    ).toBe('7');
    expect(
      a.querySelector('.nl-cell[data-rank="7"]')?.getAttribute('data-trouble')
    ).toBe('true');
    expect(
      a.querySelector('.nl-cell[data-rank="7"] .nl-cell-hang')?.textContent
    ).toBe('waiting');
    const failed = render(12, id => ({
      status: id === 9 ? 'failed' : 'running'
    }));
    expect(cellRanks(failed)[0]).toBe('9');
    expect(
      failed.node
        .querySelector('.nl-cell[data-rank="9"]')
        ?.getAttribute('data-group')
    ).toBe('failed');
  });

  it("marks the balance's straggler, with its line as the mark's title", () => {
    const summary =
      'straggler: rank 3 (ranks 0-2, 4-9 waited 41% of their time for it; it waited 3%)';
    const view = render(10, undefined, {
      balance: { straggler: 3, final: false, ranks: {}, summary }
    });
    expect(
      view.node
        .querySelector('.nl-cell[data-rank="3"] .nl-cell-straggler')
        ?.getAttribute('title')
    ).toBe(summary);
    expect(view.node.querySelectorAll('.nl-cell-straggler')).toHaveLength(1);
    expect(render(10).node.querySelectorAll('.nl-cell-straggler')).toHaveLength(
      0
    );
  });

  it('filters by status, with a count per kind', () => {
    const view = render(12, id => ({
      status: id < 3 ? 'failed' : id < 5 ? 'finished' : 'running'
    }));
    const buttons = [
      ...view.node.querySelectorAll<HTMLElement>('.nl-grid-filter')
    ].map(b => b.textContent);
    expect(buttons).toEqual(['all 12', 'failed 3', 'running 7', 'finished 2']);
    click(view.node.querySelector('.nl-grid-filter[data-filter="failed"]'));
    expect(cellRanks(view)).toEqual(['0', '1', '2']);
    click(view.node.querySelector('.nl-grid-filter[data-filter="finished"]'));
    expect(cellRanks(view)).toEqual(['3', '4']);
    view.update(
      run({
        ranks: ranks(12, id => ({ status: id < 6 ? 'finished' : 'running' }))
      })
    ); // stays on
    expect(cellRanks(view)).toEqual(['0', '1', '2', '3', '4', '5']);
    click(view.node.querySelector('.nl-grid-filter[data-filter="all"]'));
    expect(cellRanks(view)).toHaveLength(12);
  });

  it("opens a rank's lines on a click, and pinned ranks stay side by side while others are opened", () => {
    const view = render(32);
    const openColumns = () =>
      [...view.node.querySelectorAll<HTMLElement>('.nl-grid-column')].map(c => [
        c.dataset.rank,
        c.dataset.pinned ?? ''
      ]);
    click(view.node.querySelector('.nl-cell[data-rank="4"]'));
    expect(openColumns()).toEqual([['4', '']]);
    expect(
      [...view.node.querySelectorAll('.nl-grid-column .nl-line .nl-text')].map(
        n => n.textContent
      )
    ).toEqual(['first 4', 'last 4']);
    click(view.node.querySelector('.nl-cell[data-rank="9"]'));
    expect(openColumns()).toEqual([['9', '']]); // another click replaces what is not pinned
    click(view.node.querySelector('.nl-grid-column[data-rank="9"] .nl-pin'));
    click(view.node.querySelector('.nl-cell[data-rank="12"]'));
    click(view.node.querySelector('.nl-grid-column[data-rank="12"] .nl-pin'));
    click(view.node.querySelector('.nl-cell[data-rank="20"]'));
    expect(openColumns()).toEqual([
      ['9', 'true'],
      ['12', 'true'],
      ['20', '']
    ]);
    view.update(
      run({
        ranks: ranks(32, id => ({
          lines: [line(1000 + id, `new ${id}`)],
          lines_total: 3
        }))
      })
    );
    expect(
      view.node.querySelector(
        '.nl-grid-column[data-rank="12"] .nl-line .nl-text'
      )?.textContent
    ).toBe('new 12');
    click(view.node.querySelector('.nl-grid-column[data-rank="9"] .nl-pin')); // unpin: it goes when another opens
    click(view.node.querySelector('.nl-cell[data-rank="1"]'));
    expect(openColumns()).toEqual([
      ['12', 'true'],
      ['1', '']
    ]);
    for (const id of [2, 3, 5, 6, 7]) {
      click(view.node.querySelector(`.nl-cell[data-rank="${id}"]`));
      click(
        view.node.querySelector(`.nl-grid-column[data-rank="${id}"] .nl-pin`)
      );
    }
    expect(openColumns().filter(([, pinned]) => pinned)).toHaveLength(
      MAX_PINNED
    );
    click(view.node.querySelector('.nl-grid-column[data-rank="7"] .nl-close'));
    expect(openColumns().map(([id]) => id)).not.toContain('7');
  });

  it('switches between grid and columns on request, at any number of ranks', () => {
    const view = render(4);
    expect(view.node.querySelectorAll('.nl-rank')).toHaveLength(4);
    click(view.node.querySelector('.nl-layout-toggle'));
    expect(view.node.querySelectorAll('.nl-cell')).toHaveLength(4);
    expect(view.node.querySelectorAll('.nl-ranks')).toHaveLength(0);
    click(view.node.querySelector('.nl-layout-toggle'));
    expect(view.node.querySelectorAll('.nl-rank')).toHaveLength(4);
  });

  it('says how much of the run a cut output keeps', () => {
    const view = render(10, undefined, {
      saved: { limit: 300000, lines_total: 5000, lines_kept: 20 }
    });
    expect(view.node.querySelector('.nl-saved-note')?.textContent).toContain(
      'newest 20 of 5000 lines'
    );
  });
});
