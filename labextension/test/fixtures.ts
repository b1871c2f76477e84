/** Payloads for the tests, shaped like ../SCHEMA.md. */

import type { ILine, IRank, IRun } from '../src/schema';

export function line(
  n: number,
  text: string,
  extra: Partial<ILine> = {}
): ILine {
  return { n, t: n / 10, kind: 'stdout', text, ...extra };
}

export function rank(id: number, extra: Partial<IRank> = {}): IRank {
  return {
    rank: id,
    host: null,
    status: 'running',
    pid: 4000 + id,
    exit_code: null,
    lines: [],
    lines_total: 0,
    lines_dropped: 0,
    progress: null,
    history: [],
    ...extra
  };
}

export function run(extra: Partial<IRun> = {}): IRun {
  return {
    version: 1,
    run_id: '20261130-210000-1234-abcdef',
    run_dir: '/root/.cache/notebook_launcher/runs/20261130-210000-1234-abcdef',
    status: 'running',
    device: 'cpu',
    backend: 'gloo',
    start_method: 'fork',
    num_processes: 2,
    world_size: 2,
    started_at: 1796072400.0,
    elapsed: 3.25,
    attempt: 1,
    notes: ['2 processes on cpu (gloo), start method fork: safe here'],
    ranks: [rank(0), rank(1)],
    shape_mismatches: [],
    oom_retries: [],
    batch_size: null,
    triggers: [],
    failure: null,
    result: null,
    ...extra
  };
}
