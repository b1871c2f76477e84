/**
 * Following a run live over a comm to its kernel (../SCHEMA.md, "Live updates"). The kernel holds one comm per
 * run, with the id `${TARGET}.${run_id}` (`runCommId`), without announcing it. A panel showing a running run makes
 * its end of that comm in the page (no `comm_open`) and sends `{want: "full"}` on it, over the main shell, never
 * a subshell: ipykernel 7 (7.4, as tested) files the request on its shell channel's thread while the cell runs,
 * and the kernel answers with the full state, then deltas, over IOPub. Nothing the panel sends makes the kernel publish a
 * `busy`/`idle` status while the cell runs (a subshell's `idle` is taken for the kernel's: jupyterlab#10701), so
 * the kernel indicator stays busy. Every view of the run in this page shares one comm and one state; a reload or
 * a second tab asks again and catches up from the full state (which every page following the run receives).
 *
 * The MIME output (updated rarely while a panel listens) is shown when it is newer than the live state: without
 * a kernel that answers (a saved notebook, ipykernel 6, whose main shell answers only after the cell) it is the
 * panel, updated a few times a second, as in a frontend without this extension.
 *
 * `LiveRuns` holds what the page follows. The `notebook-launcher-panel:live` plugin (index.ts) makes the page's
 * one and provides it as `ILiveRuns`; each notebook's renderer factory gets it and that notebook's kernel
 * (mime.ts `createRendererFactory`). A renderer made without it (the MIME extension's own factory: outside
 * notebooks, or with that plugin disabled) shows the output alone.
 */

import { Token } from '@lumino/coreutils';
import { ISignal, Signal } from '@lumino/signaling';

import { applyDelta, ICaps, LiveMessage, LiveRun } from './delta';
import { IRun } from './schema';

export const TARGET = 'notebook_launcher.panel';

/** A new view of a run asks its kernel again if the last ask is this old and unanswered. */
export const ASK_AGAIN_MS = 1000;

/** What the panel reads of a comm message (JupyterLab's `KernelMessage.ICommMsgMsg`). */
export interface ICommMessage {
  content: { data: unknown };
  buffers?: (ArrayBuffer | ArrayBufferView)[];
}

/**
 * The kernel's message: its data, or, where the data says `packed: "json"`, the compact JSON in its first
 * binary buffer (notebook_launcher/display/comm.py `send`).
 */
export function unpack(msg: ICommMessage): LiveMessage {
  const data = msg.content.data as { packed?: string } | null;
  const buffer = msg.buffers?.[0];
  if (data && data.packed === 'json' && buffer) {
    const bytes = ArrayBuffer.isView(buffer)
      ? new Uint8Array(buffer.buffer, buffer.byteOffset, buffer.byteLength)
      : new Uint8Array(buffer);
    try {
      return JSON.parse(new TextDecoder().decode(bytes)) as LiveMessage;
    } catch {
      return { type: 'unknown' };
    }
  }
  return data as LiveMessage;
}

/** What the panel needs of a comm (JupyterLab's `Kernel.IComm`). */
export interface ICommLike {
  send(data: unknown): unknown;
  onMsg: ((msg: ICommMessage) => void | PromiseLike<void>) | null;
  onClose: ((msg: unknown) => void | PromiseLike<void>) | null;
  /** JupyterLab 4.4+: whether the comm's messages go over a subshell; set to "disabled" (the main shell). */
  commsOverSubshells?: string;
  /** True once its kernel connection dropped it (a kernel restart disposes every comm, without `onClose`). */
  isDisposed?: boolean;
}

/** The id of a run's comm, as the kernel holds it (notebook_launcher/display/comm.py `run_comm_id`). */
export function runCommId(runId: string): string {
  return `${TARGET}.${runId}`;
}

/** What the panel needs of a kernel connection (JupyterLab's `Kernel.IKernelConnection`). */
export interface IKernelLike {
  createComm(target: string, commId?: string): ICommLike;
}

/** Finds the kernel to open a panel's comm on, from the panel's node (null: none, show the output alone). */
export type KernelFinder = (node: HTMLElement) => IKernelLike | null;

type Show = (run: LiveRun) => void;

/** One run followed in this page. */
class Follow {
  state: LiveRun | null = null;
  /** Whether `state` came from the comm (then a MIME output is shown only if it is newer). */
  live = false;
  caps: ICaps | null = null;
  comm: ICommLike | null = null;
  private askedFull = false;
  /** When it last asked (Date.now()): views that appear together share one ask. */
  private askedAt = 0;
  /** Each new live state, for the views of this run. */
  readonly changed = new Signal<Follow, LiveRun>(this);

  constructor(
    readonly runId: string,
    private readonly onLive: (state: LiveRun) => void
  ) {}

  connect(kernel: IKernelLike): void {
    let comm: ICommLike;
    try {
      comm = kernel.createComm(TARGET, runCommId(this.runId));
    } catch {
      return; // comms disabled on this connection, or this comm made already: the MIME output alone
    }
    if ('commsOverSubshells' in comm) {
      // set before the comm starts a subshell of its own (its create/delete requests would publish statuses too)
      comm.commsOverSubshells = 'disabled';
    }
    this.comm = comm;
    comm.onMsg = msg => this.receive(unpack(msg));
    comm.onClose = () => {
      if (this.comm === comm) {
        this.comm = null;
      }
    };
    this.askFull();
  }

  /**
   * A new view of the run: a comm its kernel connection dropped (a restart) is let go, so the view opens one on
   * the kernel it has now; one not answered for `ASK_AGAIN_MS` (the kernel did not know the run yet: a new
   * kernel before `attach()` showed it) asks again.
   */
  revive(): void {
    if (this.comm?.isDisposed) {
      this.comm = null;
      this.askedFull = false;
    } else if (
      this.comm &&
      !this.live &&
      Date.now() - this.askedAt >= ASK_AGAIN_MS
    ) {
      this.askedFull = false;
      this.askFull();
    }
  }

  /** Ask the kernel to stop the run (a detached run's: SCHEMA.md); false without a comm that can carry it. */
  stop(): boolean {
    const comm = this.comm;
    if (!comm || comm.isDisposed || !this.live) {
      return false;
    }
    try {
      comm.send({ want: 'stop' });
    } catch {
      return false;
    }
    return true;
  }

  private askFull(): void {
    const comm = this.comm;
    if (!this.askedFull && comm) {
      this.askedFull = true;
      this.askedAt = Date.now();
      void Promise.resolve()
        .then(() => comm.send({ want: 'full' }))
        .catch(() => {
          if (this.comm === comm) {
            this.comm = null;
          }
        });
    }
  }

  receive(message: LiveMessage): void {
    if (!message || typeof message !== 'object') {
      return;
    }
    if (message.type === 'full') {
      this.caps = message.caps;
      this.askedFull = false;
      this.set({ ...message.state, seq: message.seq });
    } else if (message.type === 'delta') {
      if (
        !this.state ||
        !this.caps ||
        !this.live ||
        message.base !== this.state.seq
      ) {
        this.askFull(); // missed one (or joined mid-way): the whole state again
        return;
      }
      this.set(applyDelta(this.state, message, this.caps));
    }
  }

  private set(state: LiveRun): void {
    this.state = state;
    this.live = true;
    this.changed.emit(state);
    this.onLive(state);
  }

  /** A MIME output of this run: what to show, the output or the newer live state. */
  offer(payload: LiveRun): LiveRun {
    if (
      this.live &&
      this.state &&
      (this.state.seq ?? 0) >= (payload.seq ?? 0)
    ) {
      return this.state;
    }
    this.state = payload;
    this.live = false;
    return payload;
  }
}

/** Whether the run is going on (starting or running). */
export function isRunning(run: IRun): boolean {
  return run.status === 'running' || run.status === 'starting';
}

/**
 * The runs this page follows over their comms: one comm and one state per run, shared by every view of it. The
 * extension's `notebook-launcher-panel:live` plugin provides it (index.ts); the Runs sidebar reads it.
 */
export interface ILiveRuns {
  /** Every live state of any run (the Runs sidebar refreshes its counts). */
  readonly stateChanged: ISignal<ILiveRuns, LiveRun>;
  /** The live state of a run, if the page follows it. */
  liveState(runId: string | undefined): LiveRun | null;
  /** Whether a kernel that answers for the run can be asked to stop it (its comm is open and answered). */
  canStop(runId: string | undefined): boolean;
  /** Ask the run's kernel to stop it (`{want: "stop"}` on its comm); false where no comm can carry it. */
  stop(runId: string): boolean;
  /** A renderer's link to its run: it shows what `show` gets; comms open on the kernel `find` gives. */
  link(show: Show, find: KernelFinder): LiveLink;
}

export const ILiveRuns = new Token<ILiveRuns>(
  'notebook-launcher-panel:ILiveRuns',
  'The runs the page follows live over their comms (the run panels of notebooks), and their newest states.'
);

/** What a renderer needs to follow its run live (mime.ts `createRendererFactory`). */
export interface ILiveOptions {
  runs: ILiveRuns;
  kernel: KernelFinder;
}

export class LiveRuns implements ILiveRuns {
  private readonly follows = new Map<string, Follow>();
  private readonly changed = new Signal<ILiveRuns, LiveRun>(this);

  get stateChanged(): ISignal<ILiveRuns, LiveRun> {
    return this.changed;
  }

  liveState(runId: string | undefined): LiveRun | null {
    const follow = runId ? this.follows.get(runId) : undefined;
    return follow && follow.live ? follow.state : null;
  }

  canStop(runId: string | undefined): boolean {
    const follow = runId ? this.follows.get(runId) : undefined;
    return !!(follow && follow.live && follow.comm && !follow.comm.isDisposed);
  }

  stop(runId: string): boolean {
    return this.follows.get(runId)?.stop() ?? false;
  }

  link(show: Show, find: KernelFinder): LiveLink {
    return new LiveLink(runId => this.follow(runId), show, find);
  }

  private follow(runId: string): Follow {
    let follow = this.follows.get(runId);
    if (!follow) {
      follow = new Follow(runId, state => this.changed.emit(state));
      this.follows.set(runId, follow);
    }
    return follow;
  }
}

/** One renderer's link to its run: it shows what `show` gets, the MIME output or the live state. */
export class LiveLink {
  private follow: Follow | null = null;
  private node: HTMLElement | null = null;

  constructor(
    private readonly followOf: (runId: string) => Follow,
    private readonly show: Show,
    private readonly find: KernelFinder
  ) {}

  /** The output's payload (renderModel): shows it, or the live state when that is newer; follows a live run. */
  offer(payload: LiveRun, node: HTMLElement): void {
    const runId = typeof payload.run_id === 'string' ? payload.run_id : null;
    if (!runId) {
      this.show(payload);
      return;
    }
    const follow = this.followOf(runId);
    if (this.follow !== follow) {
      this.follow?.changed.disconnect(this.onState, this);
      this.follow = follow;
      follow.changed.connect(this.onState, this);
      follow.revive();
    }
    this.node = node;
    this.show(follow.offer(payload));
    this.connect();
  }

  /** Open the comm if the run is live and none is open (again once the output is in the page). */
  connect(): void {
    const follow = this.follow;
    if (
      !follow ||
      !follow.state ||
      follow.comm ||
      !this.node ||
      !isRunning(follow.state)
    ) {
      return;
    }
    const kernel = this.find(this.node);
    if (kernel) {
      follow.connect(kernel);
    }
  }

  dispose(): void {
    this.follow?.changed.disconnect(this.onState, this);
    this.follow = null;
  }

  private onState(_: Follow, state: LiveRun): void {
    this.show(state);
  }
}
