import { Signal } from '@lumino/signaling';
import { describe, expect, it, vi } from 'vitest';

import { ICommLike, LiveRuns } from '../src/live';
import { RunRenderer } from '../src/renderer';
import { findRuns, RunsSidebar, stopButton } from '../src/sidebar';
import { MIME_TYPE } from '../src/schema';
import { rank, run } from './fixtures';

// The sidebar only needs tokens and LabIcon from JupyterLab at run time; the real packages pull in the
// whole UI toolkit, which does not load in jsdom.
vi.mock('@jupyterlab/application', () => ({ ILayoutRestorer: {} }));
vi.mock('@jupyterlab/notebook', () => ({ INotebookTracker: {} }));
vi.mock('@jupyterlab/ui-components', () => ({ LabIcon: class {} }));

/** Just enough of a notebook panel, its model's cells and their output models for the sidebar. */
function fakePanel(id: string, path: string, outputs: unknown[][]) {
  const cells = outputs.map((data, i) => {
    const items = data.map(d => ({ data: { [MIME_TYPE]: d } }));
    return {
      id: `cell-${i}`,
      type: 'code',
      outputs: {
        get length() {
          return items.length;
        },
        get: (j: number) => items[j],
        items,
        changed: new Signal<any, any>({}),
        stateChanged: new Signal<any, any>({})
      }
    };
  });
  const list = {
    get length() {
      return cells.length;
    },
    get: (i: number) => cells[i],
    changed: new Signal<any, any>({})
  };
  const widgets = cells.map(() => ({}));
  return {
    id,
    isDisposed: false,
    cells,
    context: {
      path,
      model: { cells: list },
      pathChanged: new Signal<any, any>({})
    },
    content: {
      widgets,
      activeCellIndex: -1,
      scrollToCell: vi.fn(() => Promise.resolve())
    },
    disposed: new Signal<any, any>({})
  };
}

function fakeTracker(panels: ReturnType<typeof fakePanel>[]) {
  return {
    forEach: (fn: (panel: any) => void) => panels.forEach(fn),
    widgetAdded: new Signal<any, any>({})
  } as any;
}

/** A kernel whose one comm the test answers. */
class FakeKernel {
  comm: ICommLike | null = null;
  createComm(): ICommLike {
    this.comm = {
      open: () => undefined,
      send: () => undefined,
      onMsg: null,
      onClose: null
    };
    return this.comm;
  }
}

describe('Runs sidebar', () => {
  it('finds runs in every open notebook, in order, once each', () => {
    const a = fakePanel('nb-a', 'a.ipynb', [
      [run({ run_id: 'r1' })],
      [],
      [run({ run_id: 'r2' }), run({ run_id: 'r2' })]
    ]);
    const b = fakePanel('nb-b', 'dir/b.ipynb', [
      [run({ run_id: 'r3', status: 'failed' })]
    ]);
    const found = findRuns(fakeTracker([a, b]));
    expect(found.map(f => [f.panel.id, f.run.run_id])).toEqual([
      ['nb-a', 'r1'],
      ['nb-a', 'r2'],
      ['nb-b', 'r3']
    ]);
  });

  it('lists runs with status and rank counts, and reveals the cell on click', () => {
    const ranks = [
      rank(0, { status: 'running', progress: { step: 5, total: 10 } }),
      rank(1, { status: 'stuck' }),
      rank(2, { status: 'failed' })
    ];
    const panel = fakePanel('nb-a', 'a.ipynb', [
      [],
      [run({ run_id: 'r1', status: 'hung', ranks })]
    ]);
    const shell = { activateById: vi.fn() } as any;
    const sidebar = new RunsSidebar(fakeTracker([panel]), shell);
    document.body.replaceChildren(sidebar.node);
    sidebar.refresh();
    const item = sidebar.node.querySelector<HTMLElement>(
      '.nl-sidebar-run[data-run-id="r1"]'
    )!;
    expect(item.dataset.status).toBe('hung');
    expect([
      item.dataset.running,
      item.dataset.failed,
      item.dataset.stuck
    ]).toEqual(['1', '1', '1']);
    expect(item.querySelector('.nl-sidebar-run-ranks')?.textContent).toBe(
      '1 running · 1 failed · 1 stuck'
    );
    expect(item.querySelector('.nl-progress-text')?.textContent).toBe(
      'step 5/10'
    );
    expect(
      sidebar.node.querySelector<HTMLElement>('.nl-sidebar-empty')!.hidden
    ).toBe(true);

    vi.stubGlobal('requestAnimationFrame', (fn: () => void) => fn());
    item.click();
    expect(shell.activateById).toHaveBeenCalledWith('nb-a');
    expect(panel.content.activeCellIndex).toBe(1);
    expect(panel.content.scrollToCell).toHaveBeenCalledWith(
      panel.content.widgets[1],
      'start'
    );
    vi.unstubAllGlobals();
    sidebar.dispose();
  });

  it('says a live hang notice and counts the ranks it badged', () => {
    const ranks = [
      rank(0, { status: 'in DDP' }),
      rank(1, { status: 'waiting' })
    ];
    const hang = {
      live: true,
      t: 40,
      ranks: {},
      stacks: {},
      text: 'possible hang'
    };
    const panel = fakePanel('nb-h', 'h.ipynb', [
      [run({ run_id: 'h1', ranks, hang })]
    ]);
    const sidebar = new RunsSidebar(fakeTracker([panel]), {
      activateById: vi.fn()
    } as any);
    document.body.replaceChildren(sidebar.node);
    sidebar.refresh();
    const item = sidebar.node.querySelector<HTMLElement>(
      '.nl-sidebar-run[data-run-id="h1"]'
    )!;
    expect(item.dataset.hang).toBe('live');
    expect(item.querySelector('.nl-sidebar-run-ranks')?.textContent).toBe(
      'possible hang · 0 running · 0 failed · 0 stuck · 1 waiting · 1 in DDP'
    );
    sidebar.dispose();
  });

  it('follows output changes, one rescan for a burst of them', async () => {
    vi.useFakeTimers();
    const panel = fakePanel('nb-a', 'a.ipynb', [[run({ run_id: 'r1' })]]);
    const sidebar = new RunsSidebar(fakeTracker([panel]), {
      activateById: vi.fn()
    } as any);
    const refresh = vi.spyOn(sidebar, 'refresh');
    await vi.runAllTimersAsync();
    expect(sidebar.node.querySelectorAll('.nl-sidebar-run')).toHaveLength(1);
    const outputs = panel.cells[0].outputs;
    outputs.items[0] = {
      data: { [MIME_TYPE]: run({ run_id: 'r1', status: 'finished' }) }
    };
    outputs.stateChanged.emit(0);
    await vi.advanceTimersByTimeAsync(100);
    outputs.stateChanged.emit(0); // within RESCAN_MS of the first: the same rescan
    expect(
      sidebar.node.querySelector<HTMLElement>('.nl-sidebar-run')!.dataset.status
    ).toBe('running');
    await vi.advanceTimersByTimeAsync(60);
    expect(
      sidebar.node.querySelector<HTMLElement>('.nl-sidebar-run')!.dataset.status
    ).toBe('finished');
    await vi.runAllTimersAsync();
    expect(refresh).toHaveBeenCalledTimes(2);
    outputs.items.length = 0;
    outputs.changed.emit({});
    await vi.runAllTimersAsync();
    expect(sidebar.node.querySelectorAll('.nl-sidebar-run')).toHaveLength(0);
    expect(
      sidebar.node.querySelector<HTMLElement>('.nl-sidebar-empty')!.hidden
    ).toBe(false);
    sidebar.dispose();
    outputs.changed.emit({}); // disposed: nothing scheduled, nothing thrown
    await vi.runAllTimersAsync();
    expect(refresh).toHaveBeenCalledTimes(3);
    vi.useRealTimers();
  });

  it('shows a run followed live from its newer state, and rescans on each live state', async () => {
    vi.useFakeTimers();
    const live = new LiveRuns();
    const saved = {
      ...run({
        run_id: 'r1',
        ranks: [rank(0, { progress: { step: 1, total: 10 } })]
      }),
      seq: 0
    };
    const panel = fakePanel('nb-a', 'a.ipynb', [[saved]]);
    const kernel = new FakeKernel();
    const renderer = new RunRenderer(undefined, {
      runs: live,
      kernel: () => kernel
    });
    void renderer.renderModel({ data: { [MIME_TYPE]: saved } } as never);
    const sidebar = new RunsSidebar(
      fakeTracker([panel]),
      { activateById: vi.fn() } as any,
      live
    );
    await vi.runAllTimersAsync();
    const text = () =>
      sidebar.node.querySelector('.nl-sidebar-run .nl-progress-text')
        ?.textContent;
    expect(text()).toBe('step 1/10');
    kernel.comm!.onMsg!({
      content: {
        data: {
          type: 'full',
          run_id: 'r1',
          seq: 5,
          caps: { lines: 200, history: 200 },
          state: run({
            run_id: 'r1',
            ranks: [rank(0, { progress: { step: 7, total: 10 } })]
          })
        }
      }
    });
    await vi.runAllTimersAsync();
    expect(text()).toBe('step 7/10');
    expect(findRuns(fakeTracker([panel]))[0].run.seq).toBe(0); // without ILiveRuns: the output's
    sidebar.dispose();
    renderer.dispose();
    vi.useRealTimers();
  });

  it('offers a stop button only for a detached run that goes on, enabled where a kernel answers for it', () => {
    const live = new LiveRuns();
    expect(stopButton(run({ status: 'running' }), live)).toBe(null); // foreground: an interrupt stops it
    expect(stopButton(run({ status: 'finished', detached: true }), live)).toBe(
      null
    );
    expect(stopButton(run({ status: 'running', detached: true }), null)).toBe(
      'disabled'
    );
    expect(stopButton(run({ status: 'starting', detached: true }), live)).toBe(
      'disabled'
    ); // no kernel of this page follows it (a reload, before attach())
  });

  it("stops a detached run over its comm once the user confirms, and the run's end removes the button", async () => {
    vi.useFakeTimers();
    const live = new LiveRuns();
    const sent: unknown[] = [];
    const comm: ICommLike = {
      send: data => sent.push(data),
      onMsg: null,
      onClose: null
    };
    const saved = { ...run({ run_id: 'd1', detached: true }), seq: 0 };
    const panel = fakePanel('nb-a', 'a.ipynb', [[saved]]);
    const renderer = new RunRenderer(undefined, {
      runs: live,
      kernel: () => ({ createComm: () => comm })
    });
    void renderer.renderModel({ data: { [MIME_TYPE]: saved } } as never);
    const answers = [false, true];
    const confirm = vi.fn((runId: string) => Promise.resolve(answers.shift()!));
    const shell = { activateById: vi.fn() } as any;
    const sidebar = new RunsSidebar(fakeTracker([panel]), shell, live, confirm);
    document.body.replaceChildren(sidebar.node);
    await vi.runAllTimersAsync();
    const button = () =>
      sidebar.node.querySelector<HTMLButtonElement>(
        '.nl-sidebar-run[data-run-id="d1"] .nl-sidebar-stop'
      );
    expect(button()!.disabled).toBe(true); // asked, not yet answered: no kernel known to answer for it
    const full = (status: string, seq: number) =>
      comm.onMsg!({
        content: {
          data: {
            type: 'full',
            run_id: 'd1',
            seq,
            caps: { lines: 200, history: 200 },
            state: run({ run_id: 'd1', detached: true, status: status as any })
          }
        }
      });
    full('running', 1);
    await vi.runAllTimersAsync();
    expect(button()!.disabled).toBe(false);
    expect(button()!.dataset.stop).toBe('enabled');
    sent.length = 0;

    comm.isDisposed = true; // the kernel restarted (nothing re-renders the entry): a click greys it, asks nothing
    button()!.click();
    await vi.runAllTimersAsync();
    expect(confirm).not.toHaveBeenCalled();
    expect(button()!.dataset.stop).toBe('disabled');
    comm.isDisposed = false;
    full('running', 1); // (as if a kernel answered for it again)
    await vi.runAllTimersAsync();
    expect(button()!.dataset.stop).toBe('enabled');

    button()!.click(); // the user cancels: nothing sent
    await vi.runAllTimersAsync();
    expect(confirm).toHaveBeenCalledWith('d1');
    expect(sent).toEqual([]);
    button()!.click(); // confirmed: the kernel is asked, the button says so
    await vi.runAllTimersAsync();
    expect(sent).toEqual([{ want: 'stop' }]);
    expect(button()!.textContent).toBe('stopping…');
    expect(button()!.disabled).toBe(true);
    expect(shell.activateById).not.toHaveBeenCalled(); // the button is not the entry's click

    full('interrupted', 2); // the run's end
    await vi.runAllTimersAsync();
    const entry = sidebar.node.querySelector<HTMLElement>(
      '.nl-sidebar-run[data-run-id="d1"]'
    )!;
    expect(entry.dataset.status).toBe('interrupted');
    expect(button()).toBe(null);
    sidebar.dispose();
    renderer.dispose();
    vi.useRealTimers();
  });
});
