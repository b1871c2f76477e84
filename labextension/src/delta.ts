/**
 * The live panel's messages over its comm (../SCHEMA.md, "Live updates"): a full state once, then deltas.
 * `applyDelta` is the rule notebook_launcher/display/delta.py's `apply_delta` states; tests on both sides
 * check that deltas rebuild the kernel's state, and test/delta_contract.test.ts that this one rebuilds the
 * states the Python side made (tests/test_delta_contract.py writes them).
 */

import { IHistoryPoint, ILine, IProgress, IRank, IRun } from './schema';

/** How many lines and chart points per rank the receiver keeps (the kernel's own bounds). */
export interface ICaps {
  lines: number;
  history: number;
}

/**
 * A line relative to the one before it (the first to the change's `at`, `[n, t in ms]`): `[dn, dt in ms, text]`
 * for stdout, `[dn, dt, text, kind]` otherwise, `[dn, dt, text, "log", level, logger]` for a log record.
 */
export type LineRow = [
  number,
  number,
  string,
  string?,
  (string | null)?,
  (string | null)?
];

/** `[step, t, step_time, metrics]`. */
export type PointRow = [
  number | null,
  number,
  number | null,
  Record<string, number>
];

export interface IRankDelta extends Partial<Omit<IRank, 'lines' | 'history'>> {
  rank: number;
  new?: boolean;
  /** `[n, t in ms]` of the first new line. */
  at?: [number, number];
  lines?: LineRow[];
  /** New points without `progress`: the progress is made from them, as report() does (`derivedProgress`). */
  history?: PointRow[];
}

export interface IDelta {
  type: 'delta';
  seq: number;
  base: number;
  set?: Partial<IRun>;
  order?: number[];
  ranks?: IRankDelta[];
}

export interface IFull {
  type: 'full';
  run_id: string;
  seq: number;
  caps: ICaps;
  ended?: boolean;
  state: IRun;
}

export type LiveMessage = IDelta | IFull | { type: 'unknown'; run_id?: string };

/** A live state: the run payload and the number of the last update in it. */
export type LiveRun = IRun & { seq?: number };

export function expandLines(at: [number, number], rows: LineRow[]): ILine[] {
  let [n, ms] = at;
  return rows.map(row => {
    n += row[0];
    ms += row[1];
    const line: ILine = {
      n,
      t: ms / 1000,
      kind: (row.length > 3 ? row[3] : 'stdout') as ILine['kind'],
      text: row[2]
    };
    if (row.length > 4) {
      line.level = row[4] ?? null;
      line.logger = row[5] ?? null;
    }
    return line;
  });
}

export function expandPoint(row: PointRow): IHistoryPoint {
  return { step: row[0], t: row[1], step_time: row[2], metrics: row[3] };
}

/** The last point's step and step time, the total as before, every metric's latest value. */
export function derivedProgress(
  progress: IProgress | null | undefined,
  points: IHistoryPoint[]
): IProgress {
  const metrics: Record<string, number> = { ...(progress?.metrics || {}) };
  points.forEach(point => Object.assign(metrics, point.metrics || {}));
  const last = points[points.length - 1];
  return {
    step: last?.step ?? null,
    total: progress?.total ?? null,
    metrics,
    step_time: last?.step_time ?? null
  };
}

function blankRank(rank: number): IRank {
  return {
    rank,
    host: null,
    status: 'starting',
    pid: null,
    exit_code: null,
    lines: [],
    lines_total: 0,
    lines_dropped: 0,
    progress: null,
    history: []
  };
}

/** A new state with `delta` applied; `state` is left as it was. */
export function applyDelta(
  state: LiveRun,
  delta: IDelta,
  caps: ICaps
): LiveRun {
  const out: LiveRun = { ...state, ...(delta.set || {}), seq: delta.seq };
  delete (out as Record<string, unknown>).saved; // a cut snapshot no longer: the live lines come in whole
  const ranks = new Map<number, IRank>(
    (state.ranks || []).map(rank => [rank.rank, rank])
  );
  const order = delta.order || (state.ranks || []).map(rank => rank.rank);
  const fresh = new Set(
    (delta.ranks || []).filter(change => change.new).map(change => change.rank)
  );
  for (const id of order) {
    if (!ranks.has(id) || fresh.has(id)) {
      ranks.set(id, blankRank(id));
    }
  }
  for (const change of delta.ranks || []) {
    const rank: IRank = {
      ...(ranks.get(change.rank) || blankRank(change.rank))
    };
    const lines =
      change.lines?.length && change.at
        ? expandLines(change.at, change.lines)
        : [];
    const points = (change.history || []).map(expandPoint);
    const skip = new Set(['rank', 'at', 'lines', 'history', 'new']);
    for (const [name, value] of Object.entries(change)) {
      if (!skip.has(name)) {
        (rank as unknown as Record<string, unknown>)[name] = value;
      }
    }
    if (points.length && !('progress' in change)) {
      rank.progress = derivedProgress(rank.progress, points);
    }
    if (change.lines_total === undefined) {
      rank.lines_total = (rank.lines_total || 0) + lines.length;
    }
    if (lines.length) {
      rank.lines = [...(rank.lines || []), ...lines].slice(-caps.lines);
    }
    if (points.length) {
      rank.history = [...(rank.history || []), ...points].slice(-caps.history);
    }
    rank.lines_dropped = (rank.lines_total || 0) - (rank.lines || []).length;
    ranks.set(change.rank, rank);
  }
  out.ranks = order.map(id => ranks.get(id) as IRank);
  return out;
}
