/**
 * Types of the run payload, `application/vnd.notebook-launcher.run.v1+json` (see ../SCHEMA.md).
 * Every field is optional here on purpose: the renderer must cope with partial or older payloads and
 * ignore fields it does not know.
 */

export const MIME_TYPE = 'application/vnd.notebook-launcher.run.v1+json';

export type RunStatus =
  | 'starting'
  | 'running'
  | 'finished'
  | 'failed'
  | 'timed out'
  | 'hung'
  | 'interrupted';

export type RankStatus =
  | 'starting'
  | 'running'
  | 'finished'
  | 'failed'
  | 'stuck'
  | 'stopped'
  | 'waiting'
  | 'busy'
  | 'in DDP';

/** `failure.kind`: why the run was stopped (`StopReason`, notebook_launcher/schema/status.py). */
export type FailureKind = 'failure' | 'hang' | 'timeout' | 'interrupted';

/** Where a hang notice places a rank (`hang.ranks[...].state`; the watchdog's words). */
export type HangRankState =
  'waiting' | 'in_ddp' | 'busy' | 'finished' | 'exited';

/** A line's `kind`. */
/** `retry`: an out-of-memory retry on this rank; `attempt`: the divider where a new attempt starts. */
export type LineKind = 'stdout' | 'stderr' | 'log' | 'retry' | 'attempt';

export interface ILine {
  n: number;
  t?: number;
  kind?: LineKind;
  level?: string | null;
  logger?: string | null;
  text?: string;
}

export interface IProgress {
  step?: number | null;
  total?: number | null;
  metrics?: Record<string, number>;
  step_time?: number | null;
}

export interface IHistoryPoint {
  step?: number | null;
  t?: number;
  step_time?: number | null;
  metrics?: Record<string, number>;
}

export interface IRank {
  rank: number;
  host?: string | null;
  status?: RankStatus;
  pid?: number | null;
  exit_code?: number | null;
  lines?: ILine[];
  lines_total?: number;
  lines_dropped?: number;
  progress?: IProgress | null;
  history?: IHistoryPoint[];
  /** This rank's row of the run's summary (display/summary.py); empty fields and zero counts left out. */
  summary?: IRankRow | null;
}

/** A rank's row of the summary: display strings, the same in every frontend (its status is the rank's). */
export interface IRankRow {
  step?: string;
  speed?: string;
  eta?: string;
  last?: string;
  warnings?: number;
  errors?: number;
}

/** What the summary's verdict says happened. */
export type VerdictKind =
  | 'starting'
  | 'running'
  | 'finished'
  | 'failed'
  | 'hang'
  | 'hung'
  | 'timed out'
  | 'interrupted'
  | 'oom';

/** One of the run's first warnings and errors (the ranks' lines may no longer hold it). */
export interface IEarlyLine {
  rank: number;
  n: number;
  t?: number;
  level?: string;
  text?: string;
}

/** The run's summary, computed once by the kernel (display/summary.py): the panel's header and the fallback's top. */
export interface ISummary {
  verdict?: VerdictKind;
  title?: string;
  detail?: string[];
  balance?: string | null;
  run_id?: string;
  inspect?: string;
  early?: IEarlyLine[];
}

export interface IMismatchProcess {
  rank: number;
  operation?: string;
  shape?: unknown;
  dtype?: string | null;
  call_site?: string | null;
}

export interface IShapeMismatch {
  operation?: string;
  t?: number;
  attempt?: number;
  processes?: IMismatchProcess[];
  message?: string;
}

export interface IOomRetry {
  t?: number;
  ranks?: number[];
  batch_size?: number | null;
  new_batch_size?: number | null;
  error?: string;
}

export interface ITrigger {
  rank: number;
  t?: number;
  attempt?: number;
  call_site?: string | null;
}

export interface IFailure {
  kind?: FailureKind;
  /** The error's first paragraph: the card's title ("Rank 1 failed first: ValueError: ..."). */
  verdict?: string | null;
  rank?: number | null;
  type?: string | null;
  traceback?: string | null;
  message?: string | null;
  stacks?: Record<string, string> | null;
}

/** Where one rank is, as a hang notice tells it. */
export interface IHangRank {
  state?: HangRankState;
  text?: string;
  /** While waiting in a collective: since when (the run's elapsed seconds), so the panel counts on. */
  since_t?: number | null;
}

/** A possible hang the kernel's watchdog noticed: live until progress resumes. */
export interface IHang {
  live?: boolean;
  t?: number;
  quiet_s?: number | null;
  ranks?: Record<string, IHangRank>;
  diverged?: number | null;
  stacks?: Record<string, string>;
  stacks_dropped?: number;
  text?: string;
  /** Which ranks wait where (and which diverged), as one sentence; null when the notice has none. */
  verdict?: string | null;
  /** When the notice came and since when no rank made progress (the run's elapsed seconds). */
  notice_t?: number | null;
  quiet_since_t?: number | null;
  /** `timeout=` in seconds (null: none), and when it will stop the run (the run's elapsed seconds). */
  timeout?: number | null;
  timeout_t?: number | null;
  cleared_after?: number | null;
  cleared_t?: number | null;
  cleared_text?: string | null;
}

export interface IRun {
  version?: number;
  run_id?: string;
  run_dir?: string;
  /** The run has a supervisor of its own (`detach=True`): the Runs sidebar can ask its kernel to stop it. */
  detached?: boolean;
  status?: RunStatus;
  device?: string;
  backend?: string;
  start_method?: string;
  num_processes?: number;
  world_size?: number;
  started_at?: number;
  elapsed?: number;
  attempt?: number;
  notes?: string[];
  ranks?: IRank[];
  shape_mismatches?: IShapeMismatch[];
  oom_retries?: IOomRetry[];
  batch_size?: number | null;
  triggers?: ITrigger[];
  failure?: IFailure | null;
  result?: { type?: string } | null;
  hang?: IHang | null;
  hangs?: IHang[];
  balance?: IBalance | null;
  summary?: ISummary | null;
  /** Set when the output was cut to its budget (the run log has everything). */
  saved?: { limit?: number; lines_total?: number; lines_kept?: number } | null;
  /** The number of the last update this state includes (deltas over the comm). */
  seq?: number;
}

/** One rank's figures in the Balance section (shares are fractions of the rank's time). */
export interface IBalanceRank {
  wait_share?: number | null;
  step_wait_share?: number | null;
  step_time?: number | null;
  peak_memory?: number | null;
  device_memory?: number | null;
}

/** Where the time goes (`notebook_launcher/balance.py`, `Balance.to_json()`). */
export interface IBalance {
  straggler?: number | null;
  final?: boolean;
  ranks?: Record<string, IBalanceRank>;
  summary?: string;
}
