import { afterEach, describe, expect, it, vi } from 'vitest';

import { applyDelta, IDelta, IFull, LineRow } from '../src/delta';
import {
  ASK_AGAIN_MS,
  ICommLike,
  IKernelLike,
  KernelFinder,
  LiveRuns,
  runCommId,
  TARGET
} from '../src/live';
import { RunRenderer } from '../src/renderer';
import { IRun, MIME_TYPE } from '../src/schema';
import { line, rank, run } from './fixtures';

const CAPS = { lines: 3, history: 2 };

function delta(seq: number, extra: Partial<IDelta> = {}): IDelta {
  return { type: 'delta', seq, base: seq - 1, set: { elapsed: seq }, ...extra };
}

describe('applyDelta', () => {
  it('appends new lines and points, keeps the newest within the caps, and counts every line', () => {
    const start = {
      ...run({
        ranks: [rank(0, { lines: [line(1, 'a')], lines_total: 1 }), rank(1)]
      }),
      seq: 4
    };
    const rows: LineRow[] = [
      [0, 0, 'b'],
      [1, 100, 'c', 'log', 'WARNING', 'train'],
      [2, 200, 'd', 'stderr']
    ];
    const next = applyDelta(
      start,
      delta(5, {
        ranks: [
          {
            rank: 0,
            at: [2, 200],
            lines: rows,
            status: 'failed',
            progress: null,
            history: [
              [1, 0.1, null, {}],
              [2, 0.2, 0.1, {}],
              [3, 0.3, 0.1, {}]
            ]
          }
        ]
      }),
      CAPS
    );
    const zero = next.ranks![0];
    expect(zero.lines!.map(l => l.text)).toEqual(['b', 'c', 'd']);
    expect(zero.lines![1]).toEqual({
      n: 3,
      t: 0.3,
      kind: 'log',
      text: 'c',
      level: 'WARNING',
      logger: 'train'
    });
    expect([
      zero.lines![0].kind,
      zero.lines![2].kind,
      zero.lines![2].n,
      zero.lines![2].t
    ]).toEqual(['stdout', 'stderr', 5, 0.5]);
    expect([zero.lines_total, zero.lines_dropped, zero.status]).toEqual([
      4,
      1,
      'failed'
    ]);
    expect(zero.history!.map(p => p.step)).toEqual([2, 3]);
    expect(next.ranks![1]).toBe(start.ranks![1]); // untouched ranks are kept as they were
    expect([next.seq, next.elapsed, start.ranks![0].lines!.length]).toEqual([
      5, 5, 1
    ]); // the old state is unchanged
  });

  it('makes the progress from new points that come without one, as report() does', () => {
    const start = {
      ...run({
        ranks: [
          rank(0, {
            progress: {
              step: 4,
              total: 10,
              metrics: { loss: 1, acc: 0.5 },
              step_time: 0.2
            }
          })
        ]
      }),
      seq: 1
    };
    const next = applyDelta(
      start,
      delta(2, {
        ranks: [
          {
            rank: 0,
            history: [
              [5, 1.0, 0.25, { loss: 0.8 }],
              [6, 1.2, 0.2, { loss: 0.7 }]
            ]
          }
        ]
      }),
      CAPS
    );
    expect(next.ranks![0].progress).toEqual({
      step: 6,
      total: 10,
      metrics: { loss: 0.7, acc: 0.5 },
      step_time: 0.2
    });
    expect(next.ranks![0].history).toEqual([
      { step: 5, t: 1.0, step_time: 0.25, metrics: { loss: 0.8 } },
      { step: 6, t: 1.2, step_time: 0.2, metrics: { loss: 0.7 } }
    ]);
  });

  it('takes lines_total when more lines came than the state keeps, adds and drops ranks by order', () => {
    const start = {
      ...run({ ranks: [rank(0), rank(1)] }),
      seq: 1,
      saved: { lines_total: 9, lines_kept: 2 }
    };
    const next = applyDelta(
      start,
      delta(2, {
        order: [1, 2],
        ranks: [
          { rank: 1, at: [40, 1000], lines: [[0, 0, 'x']], lines_total: 40 },
          { rank: 2, new: true, status: 'running', lines_total: 0 }
        ]
      }),
      CAPS
    );
    expect(
      next.ranks!.map(r => [r.rank, r.status, r.lines_total, r.lines_dropped])
    ).toEqual([
      [1, 'running', 40, 39],
      [2, 'running', 0, 0]
    ]);
    expect('saved' in next).toBe(false); // the cut snapshot's note goes once lines come in whole
  });
});

class FakeComm implements ICommLike {
  commsOverSubshells = 'perCommTarget';
  isDisposed = false;
  sent: unknown[] = [];
  onMsg: ICommLike['onMsg'] = null;
  onClose: ICommLike['onClose'] = null;
  send(data: unknown) {
    this.sent.push(data);
  }
  deliver(data: unknown) {
    void this.onMsg?.({ content: { data } });
  }
  /** As the kernel sends it (display/comm.py `send`): compact JSON in a binary buffer. */
  deliverPacked(message: { type: string }, asView = false) {
    const bytes = new TextEncoder().encode(JSON.stringify(message));
    const buffer = asView ? new DataView(bytes.buffer) : bytes.buffer;
    void this.onMsg?.({
      content: { data: { type: message.type, packed: 'json' } },
      buffers: [buffer]
    });
  }
}

const flush = () => new Promise(resolve => setTimeout(resolve, 0));

class FakeKernel implements IKernelLike {
  comms: { target: string; id?: string; comm: FakeComm }[] = [];
  createComm(target: string, id?: string) {
    const comm = new FakeComm();
    this.comms.push({ target, id, comm });
    return comm;
  }
}

let runs = new LiveRuns();

function mount(
  payload: IRun,
  kernel: KernelFinder | null = () => null
): RunRenderer {
  const renderer = new RunRenderer(undefined, kernel ? { runs, kernel } : null);
  document.body.appendChild(renderer.node);
  void renderer.renderModel({ data: { [MIME_TYPE]: payload } } as never);
  return renderer;
}

function lineTexts(root: ParentNode, rankId: number): string[] {
  return [
    ...root.querySelectorAll(
      `.nl-rank[data-rank="${rankId}"] .nl-line .nl-text`
    )
  ].map(n => n.textContent || '');
}

describe('a panel following its run over a comm', () => {
  afterEach(() => {
    runs = new LiveRuns();
    document.body.replaceChildren();
  });

  it('makes one comm for a running run, asks for its state, shows it then each delta, ignores older outputs', async () => {
    const kernel = new FakeKernel();
    const payload = { ...run({ ranks: [rank(0), rank(1)] }), seq: 0 };
    const first = mount(payload, () => kernel);
    const second = mount(payload, () => kernel); // the same run shown twice in the page: one comm
    await flush();
    // the run's own comm (no comm_open), on the main shell (no subshell), asked for the full state once
    expect(
      kernel.comms.map(c => [
        c.target,
        c.id,
        c.comm.commsOverSubshells,
        c.comm.sent
      ])
    ).toEqual([
      [TARGET, runCommId(payload.run_id!), 'disabled', [{ want: 'full' }]]
    ]);
    const comm = kernel.comms[0].comm;
    const full: IFull = {
      type: 'full',
      run_id: payload.run_id!,
      seq: 3,
      caps: { lines: 200, history: 200 },
      state: run({
        ranks: [rank(0, { lines: [line(1, 'one')], lines_total: 1 }), rank(1)]
      })
    };
    comm.deliver(full);
    comm.deliver(
      delta(4, { ranks: [{ rank: 0, at: [2, 100], lines: [[0, 0, 'two']] }] })
    );
    for (const renderer of [first, second]) {
      expect(lineTexts(renderer.node, 0)).toEqual(['one', 'two']);
    }
    void first.renderModel({
      data: { [MIME_TYPE]: { ...payload, seq: 3 } }
    } as never); // a rare MIME refresh
    expect(lineTexts(first.node, 0)).toEqual(['one', 'two']);
    comm.deliver(delta(6)); // a gap: it asks for the whole state once, and waits for it
    comm.deliver(delta(7));
    await flush();
    expect(comm.sent).toEqual([{ want: 'full' }, { want: 'full' }]);
    comm.deliver({
      ...full,
      seq: 7,
      state: run({
        ranks: [rank(0, { lines: [line(9, 'nine')], lines_total: 9 }), rank(1)]
      })
    });
    expect(lineTexts(second.node, 0)).toEqual(['nine']);
  });

  it('reads the messages packed in a binary buffer, as an ArrayBuffer or a view of one', () => {
    const kernel = new FakeKernel();
    const payload = { ...run({ ranks: [rank(0)] }), seq: 0 };
    const renderer = mount(payload, () => kernel);
    const comm = kernel.comms[0].comm;
    comm.deliverPacked({
      type: 'full',
      run_id: payload.run_id,
      seq: 3,
      caps: { lines: 200, history: 200 },
      state: run({
        ranks: [rank(0, { lines: [line(1, 'one é')], lines_total: 1 })]
      })
    } as IFull);
    comm.deliverPacked(
      delta(4, {
        ranks: [{ rank: 0, at: [2, 100], lines: [[0, 0, 'two "quoted"']] }]
      }),
      true
    );
    expect(lineTexts(renderer.node, 0)).toEqual(['one é', 'two "quoted"']);
  });

  it('catches up after a reload: a saved mid-run output gets the full state, then deltas', () => {
    const kernel = new FakeKernel();
    const stale = {
      ...run({ ranks: [rank(0, { lines: [line(1, 'old')], lines_total: 1 })] }),
      seq: 2
    };
    const renderer = mount(stale, () => kernel);
    expect(lineTexts(renderer.node, 0)).toEqual(['old']);
    const comm = kernel.comms[0].comm;
    comm.deliver({
      type: 'full',
      run_id: stale.run_id,
      seq: 40,
      caps: { lines: 200, history: 200 },
      state: run({
        elapsed: 30,
        ranks: [rank(0, { lines: [line(80, 'now')], lines_total: 80 })]
      })
    });
    comm.deliver(
      delta(41, {
        ranks: [{ rank: 0, at: [81, 31000], lines: [[0, 0, 'next']] }]
      })
    );
    expect(lineTexts(renderer.node, 0)).toEqual(['now', 'next']);
    expect(
      renderer.node.querySelector('.nl-rank .nl-dropped')?.textContent
    ).toContain('79 earlier lines');
  });

  it('shows the output alone when no kernel answers, and opens no comm for an ended run', () => {
    const kernel = new FakeKernel();
    const renderer = mount(
      run({
        status: 'finished',
        ranks: [rank(0, { lines: [line(1, 'done')] })]
      }),
      () => kernel
    );
    expect(kernel.comms).toEqual([]);
    expect(lineTexts(renderer.node, 0)).toEqual(['done']);
    const live = mount(
      run({ run_id: 'other', ranks: [rank(0, { lines: [line(1, 'a')] })] }),
      () => null
    );
    void live.renderModel({
      data: {
        [MIME_TYPE]: run({
          run_id: 'other',
          ranks: [rank(0, { lines: [line(1, 'a'), line(2, 'b')] })]
        })
      }
    } as never);
    expect(lineTexts(live.node, 0)).toEqual(['a', 'b']);
  });

  it('tells the page of every live state, and knows the newest state of each followed run', () => {
    const kernel = new FakeKernel();
    const seen: [string | undefined, number | undefined][] = [];
    runs.stateChanged.connect((_, state) =>
      seen.push([state.run_id, state.seq])
    );
    const payload = { ...run({ ranks: [rank(0)] }), seq: 0 };
    mount(payload, () => kernel);
    expect(runs.liveState(payload.run_id)).toBeNull(); // the output alone: not live yet
    const comm = kernel.comms[0].comm;
    comm.deliver({
      type: 'full',
      run_id: payload.run_id,
      seq: 3,
      caps: { lines: 200, history: 200 },
      state: run()
    });
    comm.deliver(delta(4));
    expect(seen).toEqual([
      [payload.run_id, 3],
      [payload.run_id, 4]
    ]);
    expect(runs.liveState(payload.run_id)?.seq).toBe(4);
    expect([runs.liveState('other'), runs.liveState(undefined)]).toEqual([
      null,
      null
    ]);
  });

  it('a disposed renderer is no longer drawn by its run; one made without live shows its output alone', () => {
    const kernel = new FakeKernel();
    const payload = { ...run({ ranks: [rank(0)] }), seq: 0 };
    const gone = mount(payload, () => kernel);
    const kept = mount(payload, () => kernel);
    gone.dispose();
    const comm = kernel.comms[0].comm;
    comm.deliver({
      type: 'full',
      run_id: payload.run_id,
      seq: 3,
      caps: { lines: 200, history: 200 },
      state: run({
        ranks: [rank(0, { lines: [line(1, 'one')], lines_total: 1 })]
      })
    });
    expect([lineTexts(kept.node, 0), lineTexts(gone.node, 0)]).toEqual([
      ['one'],
      []
    ]);
    const plain = mount(payload, null); // no ILiveRuns (the MIME extension's own factory)
    expect(kernel.comms).toHaveLength(1);
    expect(
      plain.node.querySelector('.nl-run')?.getAttribute('data-status')
    ).toBe('running');
    void plain.renderModel({
      data: {
        [MIME_TYPE]: {
          ...payload,
          ranks: [rank(0, { lines: [line(1, 'saved')] })]
        }
      }
    } as never);
    expect(lineTexts(plain.node, 0)).toEqual(['saved']); // the output, though the page has a newer live state
  });

  it('a detached run shown again after a kernel restart or a reload follows it on the kernel that knows it', async () => {
    vi.useFakeTimers({ toFake: ['Date'] });
    const kernel = new FakeKernel();
    const payload = { ...run({ detached: true }), seq: 40 };
    mount(payload, () => kernel); // the launching cell's output
    await flush();
    const first = kernel.comms[0].comm;
    expect(first.sent).toEqual([{ want: 'full' }]);
    // a reload before attach(): the new kernel does not know the run and never answers; the next view of it
    // (attach() shows it a while later) asks again on the same comm, and that kernel answers
    vi.setSystemTime(Date.now() + ASK_AGAIN_MS);
    const attached = mount({ ...payload, seq: 0 }, () => kernel);
    await flush();
    expect(kernel.comms).toHaveLength(1);
    expect(first.sent).toEqual([{ want: 'full' }, { want: 'full' }]);
    first.deliver({
      type: 'full',
      run_id: payload.run_id,
      seq: 2,
      caps: CAPS,
      state: run({
        detached: true,
        ranks: [rank(0, { lines: [line(1, 'after')], lines_total: 1 })]
      })
    });
    await flush();
    for (const node of document.querySelectorAll('.nl-run')) {
      expect(lineTexts(node, 0)).toEqual(['after']); // both views: the live state
    }
    expect(runs.canStop(payload.run_id)).toBe(true);
    // a kernel restart disposes every comm (no onClose): the next view opens a new one and asks
    first.isDisposed = true;
    expect(runs.canStop(payload.run_id)).toBe(false);
    expect(runs.stop(payload.run_id!)).toBe(false);
    mount({ ...payload, seq: 0 }, () => kernel);
    await flush();
    expect(kernel.comms).toHaveLength(2);
    expect(kernel.comms[1].comm.sent).toEqual([{ want: 'full' }]);
    attached.dispose();
    vi.useRealTimers();
  });
});
