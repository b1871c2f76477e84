import { Widget } from '@lumino/widgets';
import { describe, expect, it, vi } from 'vitest';

import { RunRenderer, RunView } from '../src/renderer';
import { MIME_TYPE } from '../src/schema';
import { line, rank, run } from './fixtures';

const XSS = '<img src=x onerror="window.__pwned = 1">';

function render(data = run()): RunView {
  const view = new RunView();
  document.body.replaceChildren(view.node);
  view.update(data);
  return view;
}

function texts(root: ParentNode, selector: string): string[] {
  return [...root.querySelectorAll(selector)].map(
    node => node.textContent || ''
  );
}

describe('RunView', () => {
  it('renders the header with status, run id and fields', () => {
    const view = render(run({ batch_size: 32, attempt: 2 }));
    expect(view.node.dataset.status).toBe('running');
    expect(
      view.node
        .querySelector('.nl-header .nl-status')
        ?.getAttribute('data-status')
    ).toBe('running');
    expect(view.node.querySelector('.nl-run-id')?.textContent).toBe(
      '20261130-210000-1234-abcdef'
    );
    const fields = texts(view.node, '.nl-field');
    expect(fields).toEqual(
      expect.arrayContaining([
        '2 ranks',
        'cpu',
        'gloo',
        'start method fork',
        '3.3 s',
        'attempt 2',
        'batch size 32'
      ])
    );
    expect(texts(view.node, '.nl-note')).toEqual([
      '2 processes on cpu (gloo), start method fork: safe here'
    ]);
  });

  it('renders one column per rank with its lines in order', () => {
    const view = render(
      run({
        ranks: [
          rank(0, {
            lines: [
              line(1, 'a0'),
              line(3, 'b0', { kind: 'stderr' }),
              line(4, 'c0')
            ]
          }),
          rank(1, {
            status: 'stuck',
            lines: [
              line(2, 'a1', { kind: 'log', level: 'WARNING', logger: 'train' })
            ]
          })
        ]
      })
    );
    const columns = view.node.querySelectorAll<HTMLElement>('.nl-rank');
    expect([...columns].map(c => [c.dataset.rank, c.dataset.status])).toEqual([
      ['0', 'running'],
      ['1', 'stuck']
    ]);
    expect(texts(columns[0], '.nl-line .nl-text')).toEqual(['a0', 'b0', 'c0']);
    expect(
      columns[0].querySelector('.nl-line[data-kind="stderr"]')?.textContent
    ).toBe('b0');
    const log = columns[1].querySelector<HTMLElement>(
      '.nl-line[data-kind="log"]'
    )!;
    expect(log.dataset.level).toBe('WARNING');
    expect(log.querySelector('.nl-logger')?.textContent).toBe('train');
    expect(
      view.node
        .querySelector<HTMLElement>('.nl-ranks')!
        .style.getPropertyValue('--nl-cols')
    ).toBe('2');
  });

  it('never interprets user text as HTML', () => {
    const view = render(
      run({
        status: 'failed',
        ranks: [
          rank(0, {
            lines: [
              line(1, XSS),
              line(2, XSS, { kind: 'log', level: 'ERROR', logger: XSS })
            ],
            progress: {
              step: 1,
              total: 2,
              metrics: { [XSS]: 1 },
              step_time: 0.1
            },
            history: [{ step: 1, t: 1, step_time: 0.1, metrics: { [XSS]: 1 } }]
          })
        ],
        notes: [XSS],
        shape_mismatches: [
          {
            operation: XSS,
            processes: [
              {
                rank: 0,
                operation: XSS,
                shape: [XSS],
                dtype: XSS,
                call_site: XSS
              }
            ],
            message: XSS
          }
        ],
        oom_retries: [
          { t: 1, ranks: [0], batch_size: 8, new_batch_size: 4, error: XSS }
        ],
        triggers: [{ rank: 0, t: 1, call_site: XSS }],
        failure: {
          kind: 'failure',
          rank: 0,
          type: XSS,
          traceback: XSS,
          message: XSS,
          stacks: { '0': XSS }
        }
      })
    );
    expect(view.node.querySelector('img')).toBeNull();
    expect(document.querySelector('img')).toBeNull();
    expect((window as any).__pwned).toBeUndefined();
    expect(texts(view.node, '.nl-line .nl-text')).toEqual([XSS, XSS]);
    expect(view.node.querySelector('.nl-traceback')?.textContent).toBe(XSS);
    expect(view.node.textContent).toContain(XSS);
  });

  it('renders a table row per process for each shape mismatch', () => {
    const view = render(
      run({
        shape_mismatches: [
          {
            operation: 'torch.distributed.all_gather_into_tensor',
            t: 2.1,
            processes: [
              {
                rank: 0,
                operation: 'torch.distributed.all_gather_into_tensor',
                shape: [4],
                dtype: 'torch.float32',
                call_site: 'train.py:12 in step'
              },
              {
                rank: 1,
                operation: 'torch.distributed.all_gather_into_tensor',
                shape: [4],
                dtype: 'torch.float32',
                call_site: 'train.py:12 in step'
              },
              {
                rank: 2,
                operation: 'torch.distributed.all_gather_into_tensor',
                shape: [5, 2],
                dtype: 'torch.float32',
                call_site: 'train.py:12 in step'
              }
            ],
            message: 'Cannot apply desired operation due to shape mismatches.'
          }
        ]
      })
    );
    const rows = view.node.querySelectorAll<HTMLElement>(
      '.nl-mismatch table tr[data-rank]'
    );
    expect([...rows].map(r => r.dataset.rank)).toEqual(['0', '1', '2']);
    expect(texts(rows[2], 'td')).toEqual([
      'rank 2',
      'torch.distributed.all_gather_into_tensor',
      '[5, 2]',
      'torch.float32',
      'train.py:12 in step'
    ]);
    expect([...rows].map(r => r.dataset.differs ?? '')).toEqual([
      '',
      '',
      'true'
    ]);
    expect(
      view.node.querySelector('.nl-mismatch-message')?.textContent
    ).toContain('shape mismatches');
  });

  it('renders the OOM retry timeline and the triggers', () => {
    const view = render(
      run({
        batch_size: 16,
        oom_retries: [
          {
            t: 1.5,
            ranks: [1],
            batch_size: 64,
            new_batch_size: 32,
            error: 'CUDA out of memory. Tried 2 GiB'
          },
          {
            t: 2.5,
            ranks: [0, 1],
            batch_size: 32,
            new_batch_size: 16,
            error: 'CUDA out of memory.'
          }
        ],
        triggers: [{ rank: 1, t: 2.4, call_site: 'train.py:30 in train' }]
      })
    );
    const rows = view.node.querySelectorAll<HTMLElement>('.nl-oom-row');
    expect(rows).toHaveLength(2);
    expect([rows[0].dataset.batchSize, rows[0].dataset.newBatchSize]).toEqual([
      '64',
      '32'
    ]);
    expect(rows[0].querySelector('.nl-oom-sizes')?.textContent).toBe(
      'batch size 64 → retried at batch size 32'
    );
    expect(rows[1].querySelector('.nl-oom-ranks')?.textContent).toBe(
      'out of memory on ranks 0, 1'
    );
    expect(view.node.querySelectorAll('.nl-oom-ranks')[0].textContent).toBe(
      'out of memory on rank 1'
    );
    expect(rows[0].querySelector('.nl-oom-error')?.textContent).toBe(
      'CUDA out of memory. Tried 2 GiB'
    );
    const trigger = view.node.querySelector<HTMLElement>('.nl-trigger')!;
    expect(trigger.dataset.rank).toBe('1');
    expect(trigger.textContent).toContain('train.py:30 in train');
  });

  it('puts the failure first: traceback, then the full message, above the rank columns', () => {
    const view = render(
      run({
        status: 'failed',
        ranks: [
          rank(0, { status: 'finished' }),
          rank(1, { status: 'failed', exit_code: 1 })
        ],
        failure: {
          kind: 'failure',
          rank: 1,
          type: 'ValueError',
          traceback:
            'Traceback (most recent call last):\n  File "train.py", line 3\nValueError: bad',
          message: 'Rank 1 failed with ValueError: bad\nrank 0: finished',
          stacks: null
        }
      })
    );
    const failure = view.node.querySelector<HTMLElement>('.nl-failure')!;
    expect(failure.dataset.kind).toBe('failure');
    expect(failure.dataset.rank).toBe('1');
    const ranks = view.node.querySelector('.nl-ranks')!;
    expect(
      failure.compareDocumentPosition(ranks) & Node.DOCUMENT_POSITION_FOLLOWING
    ).toBeTruthy();
    expect(view.node.firstElementChild?.classList.contains('nl-header')).toBe(
      true
    );
    expect(
      failure.previousElementSibling?.classList.contains('nl-header')
    ).toBe(true);
    expect(failure.querySelector('.nl-failure-title')?.textContent).toBe(
      'Rank 1 failed: ValueError'
    );
    const blocks = [...failure.querySelectorAll('pre')].map(
      pre => pre.className
    );
    expect(blocks).toEqual(['nl-traceback', 'nl-failure-message']);
  });

  it("shows each rank's stack for a hang", () => {
    const view = render(
      run({
        status: 'hung',
        failure: {
          kind: 'hang',
          rank: null,
          type: null,
          traceback: null,
          message: 'no progress',
          stacks: { '1': 'stack of 1', '0': 'stack of 0' }
        }
      })
    );
    const stacks = view.node.querySelectorAll<HTMLElement>(
      '.nl-failure .nl-stack'
    );
    expect(
      [...stacks].map(s => [
        s.dataset.rank,
        s.querySelector('pre')?.textContent
      ])
    ).toEqual([
      ['0', 'stack of 0'],
      ['1', 'stack of 1']
    ]);
  });

  it('moves the elapsed clock of a running run between updates, for a bounded time', () => {
    vi.useFakeTimers();
    try {
      const view = render(run({ status: 'running', elapsed: 5 }));
      const elapsed = () =>
        view.node.querySelector('[data-field="elapsed"]')?.textContent;
      expect(elapsed()).toBe('5.0 s');
      vi.advanceTimersByTime(3000);
      expect(elapsed()).toBe('8.0 s');
      vi.advanceTimersByTime(60_000); // no update for a long while: the kernel may be gone, the clock stops
      expect(elapsed()).toBe('50.0 s');
      view.update(run({ status: 'finished', elapsed: 70 }));
      vi.advanceTimersByTime(5000);
      expect(elapsed()).toBe('1 min 10 s');
      view.dispose();
    } finally {
      vi.useRealTimers();
    }
  });

  it('leaves empty sections out of the DOM', () => {
    const view = render();
    for (const selector of [
      '.nl-failure',
      '.nl-mismatches',
      '.nl-oom',
      '.nl-triggers'
    ]) {
      expect(view.node.querySelector(selector)).toBeNull();
    }
  });

  it('says where dropped lines are', () => {
    const view = render(
      run({
        ranks: [
          rank(0, {
            lines: [line(21, 'x')],
            lines_total: 21,
            lines_dropped: 20
          }),
          rank(1)
        ]
      })
    );
    const notes = view.node.querySelectorAll<HTMLElement>('.nl-dropped');
    expect(notes[0].hidden).toBe(false);
    expect(notes[0].textContent).toBe(
      '20 earlier lines are in the run log: /root/.cache/notebook_launcher/runs/20261130-210000-1234-abcdef'
    );
    expect(notes[1].hidden).toBe(true);
  });

  it('renders progress bars and charts on a scale shared by all ranks', () => {
    const history = (stepTime: number) =>
      [1, 2, 3].map(step => ({
        step,
        t: step,
        step_time: stepTime,
        metrics: { loss: 1 / step, acc: step }
      }));
    const view = render(
      run({
        ranks: [
          rank(0, {
            progress: {
              step: 3,
              total: 4,
              metrics: { loss: 0.33 },
              step_time: 0.05
            },
            history: history(0.05)
          }),
          rank(1, {
            progress: { step: 3, total: null, metrics: {}, step_time: 0.5 },
            history: history(0.5)
          })
        ]
      })
    );
    const progress = view.node.querySelectorAll<HTMLElement>('.nl-progress');
    expect([progress[0].dataset.step, progress[0].dataset.total]).toEqual([
      '3',
      '4'
    ]);
    expect(
      progress[0].querySelector<HTMLElement>('.nl-progress-fill')!.style.width
    ).toBe('75%');
    expect(progress[0].textContent).toBe('step 3/4 · loss 0.33 · 0.05 s/step');
    expect(progress[1].querySelector('.nl-indeterminate')).not.toBeNull();
    const charts = view.node.querySelectorAll<SVGElement>('.nl-rank .nl-chart');
    expect([...charts].map(c => c.dataset.series)).toEqual([
      'loss',
      'step_time',
      'loss',
      'step_time'
    ]);
    // Shared y scale: the fast rank's step_time line sits at the bottom, the straggler's at the top.
    const y = (chart: SVGElement) =>
      chart
        .querySelector('polyline')!
        .getAttribute('points')!
        .split(' ')[0]
        .split(',')[1];
    expect(Number(y(charts[1]))).toBeGreaterThan(Number(y(charts[3])));
  });
});

describe('updates', () => {
  it('keeps one panel and patches lines in place', () => {
    const renderer = new RunRenderer();
    document.body.replaceChildren(renderer.node);
    const model = (data: unknown) => ({ data: { [MIME_TYPE]: data } }) as any;
    void renderer.renderModel(
      model(
        run({ ranks: [rank(0, { lines: [line(1, 'one'), line(2, 'two')] })] })
      )
    );
    const panel = renderer.node.querySelector('.nl-run');
    const two = renderer.node.querySelector('.nl-line[data-n="2"]');

    void renderer.renderModel(
      model(
        run({
          status: 'finished',
          ranks: [
            rank(0, {
              status: 'finished',
              lines: [line(2, 'two'), line(3, 'three')],
              lines_dropped: 1
            })
          ]
        })
      )
    );
    expect(renderer.node.querySelectorAll('.nl-run')).toHaveLength(1);
    expect(renderer.node.querySelector('.nl-run')).toBe(panel);
    expect(renderer.node.querySelector('.nl-line[data-n="2"]')).toBe(two);
    expect(texts(renderer.node, '.nl-line .nl-text')).toEqual(['two', 'three']);
    expect(
      renderer.node.querySelector<HTMLElement>('.nl-run')!.dataset.status
    ).toBe('finished');
    expect(
      renderer.node.querySelector<HTMLElement>('.nl-rank')!.dataset.status
    ).toBe('finished');
  });

  it('rebuilds lines when the numbering starts over (a new attempt)', () => {
    const view = render(
      run({ ranks: [rank(0, { lines: [line(5, 'old'), line(6, 'old2')] })] })
    );
    view.update(
      run({ attempt: 2, ranks: [rank(0, { lines: [line(1, 'new')] })] })
    );
    expect(texts(view.node, '.nl-line .nl-text')).toEqual(['new']);
  });

  it('removes ranks that are gone and adds new ones in order', () => {
    const view = render(run({ ranks: [rank(0), rank(1)] }));
    view.update(run({ ranks: [rank(0), rank(2), rank(3)] }));
    expect(
      [...view.node.querySelectorAll<HTMLElement>('.nl-rank')].map(
        c => c.dataset.rank
      )
    ).toEqual(['0', '2', '3']);
  });

  it('keeps a column pinned to the bottom unless the user scrolled up in it', () => {
    const view = render(
      run({
        ranks: [
          rank(0, { lines: [line(1, 'a')] }),
          rank(1, { lines: [line(2, 'b')] })
        ]
      })
    );
    const [pinned, scrolled] = [
      ...view.node.querySelectorAll<HTMLElement>('.nl-lines')
    ];
    // jsdom has no layout: fake 100px per line in a 100px tall box, and scroll like a user would.
    for (const node of [pinned, scrolled]) {
      Object.defineProperty(node, 'scrollHeight', {
        get: () => node.childElementCount * 100,
        configurable: true
      });
      Object.defineProperty(node, 'clientHeight', {
        get: () => 100,
        configurable: true
      });
    }
    const userScroll = (node: HTMLElement, top: number) => {
      node.scrollTop = top;
      node.dispatchEvent(new Event('scroll'));
    };
    const lines = (id: number, ns: number[]) =>
      rank(id, { lines: ns.map(n => line(n, `${n}`)) });
    view.update(run({ ranks: [lines(0, [1, 3]), lines(1, [2, 4])] }));
    expect([pinned.scrollTop, scrolled.scrollTop]).toEqual([200, 200]);
    userScroll(scrolled, 0); // up to the first line
    view.update(run({ ranks: [lines(0, [1, 3, 5]), lines(1, [2, 4, 6])] }));
    expect([pinned.scrollTop, scrolled.scrollTop]).toEqual([300, 0]);
    userScroll(scrolled, 200); // back at the bottom: follows again
    view.update(
      run({ ranks: [lines(0, [1, 3, 5, 7]), lines(1, [2, 4, 6, 8])] })
    );
    expect([pinned.scrollTop, scrolled.scrollTop]).toEqual([400, 400]);
  });

  it('pins columns again when the panel is attached (outputs render before they are in the page)', () => {
    const renderer = new RunRenderer();
    void renderer.renderModel({
      data: {
        [MIME_TYPE]: run({
          ranks: [rank(0, { lines: [line(1, 'a'), line(2, 'b')] })]
        })
      }
    } as any);
    const box = renderer.node.querySelector<HTMLElement>('.nl-lines')!;
    Object.defineProperty(box, 'scrollHeight', {
      get: () => 500,
      configurable: true
    });
    Widget.attach(renderer, document.body);
    expect(box.scrollTop).toBe(500);
    Widget.detach(renderer);
  });

  it('copes with a payload missing most fields', () => {
    const view = render({ run_id: 'x' } as any);
    expect(view.node.dataset.status).toBe('unknown');
    expect(view.node.querySelectorAll('.nl-rank')).toHaveLength(0);
  });
});
