/**
 * Following a run live over a comm to its kernel (../SCHEMA.md, "Live updates"). A panel showing a running run
 * opens one comm (target `notebook_launcher.panel`, `{run_id}`) through the notebook's kernel connection; the
 * kernel answers with the full state, then deltas (delta.ts). JupyterLab sends comm messages over a kernel
 * subshell, so this works while the launching cell runs. Every view of the run in this page shares one comm and
 * one state; a reload or a second tab opens its own and catches up from the full state.
 *
 * The MIME output (updated rarely while a panel listens) is shown when it is newer than the live state: without
 * a kernel (a saved notebook, a kernel that never answers) it is the panel, as before.
 */

import { applyDelta, ICaps, LiveMessage, LiveRun } from './delta';
import { IRun } from './schema';

export const TARGET = 'notebook_launcher.panel';

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
    const bytes = ArrayBuffer.isView(buffer) ? new Uint8Array(buffer.buffer, buffer.byteOffset, buffer.byteLength)
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
  open(data?: unknown): unknown;
  send(data: unknown): unknown;
  onMsg: ((msg: ICommMessage) => void | PromiseLike<void>) | null;
  onClose: ((msg: unknown) => void | PromiseLike<void>) | null;
  /** Resolves once the comm's kernel subshell exists (JupyterLab 4.4+; never, where the kernel has none). */
  subshellStarted?: Promise<void>;
}

/** How long to wait for the subshell before opening on the main shell (answered only once the cell is done). */
const SUBSHELL_WAIT_MS = 3000;

/** What the panel needs of a kernel connection (JupyterLab's `Kernel.IKernelConnection`). */
export interface IKernelLike {
  createComm(target: string): ICommLike;
}

/** Finds the kernel of the notebook a node is in (set by the plugin; none in tests or without JupyterLab). */
export type KernelFinder = (node: HTMLElement) => IKernelLike | null;

let finder: KernelFinder | null = null;

export function setKernelFinder(find: KernelFinder | null): void {
  finder = find;
}

type Show = (run: IRun) => void;

/** One run followed in this page. */
class Follow {
  state: LiveRun | null = null;
  /** Whether `state` came from the comm (then a MIME output is shown only if it is newer). */
  live = false;
  caps: ICaps | null = null;
  comm: ICommLike | null = null;
  private askedFull = false;
  readonly views = new Set<Show>();
  readonly listeners = new Set<(run: LiveRun) => void>();

  constructor(readonly runId: string) {}

  connect(kernel: IKernelLike): void {
    let comm: ICommLike;
    try {
      comm = kernel.createComm(TARGET);
    } catch {
      return; // comms disabled on this connection: the MIME output alone
    }
    this.comm = comm;
    comm.onMsg = msg => this.receive(unpack(msg));
    comm.onClose = () => {
      if (this.comm === comm) {
        this.comm = null;
      }
    };
    // opened before its subshell exists, the comm would go to the main shell, busy with the launching cell
    const started = comm.subshellStarted
      ? Promise.race([comm.subshellStarted, new Promise(resolve => setTimeout(resolve, SUBSHELL_WAIT_MS))])
      : Promise.resolve();
    void started
      .catch(() => undefined)
      .then(() => comm.open({ run_id: this.runId }))
      .catch(() => {
        if (this.comm === comm) {
          this.comm = null;
        }
      });
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
      if (!this.state || !this.caps || !this.live || message.base !== this.state.seq) {
        if (!this.askedFull && this.comm) {
          this.askedFull = true; // missed one (or joined mid-way): the whole state again
          void Promise.resolve(this.comm.send({ want: 'full' })).catch(() => undefined);
        }
        return;
      }
      this.set(applyDelta(this.state, message, this.caps));
    }
  }

  private set(state: LiveRun): void {
    this.state = state;
    this.live = true;
    this.views.forEach(show => show(state));
    this.listeners.forEach(listener => listener(state));
  }

  /** A MIME output of this run: what to show, the output or the newer live state. */
  offer(payload: LiveRun): LiveRun {
    if (this.live && this.state && (this.state.seq ?? 0) >= (payload.seq ?? 0)) {
      return this.state;
    }
    this.state = payload;
    this.live = false;
    return payload;
  }
}

const follows = new Map<string, Follow>();

function isRunning(run: IRun): boolean {
  return run.status === 'running' || run.status === 'starting';
}

/** The live state of a run in this page, if it is followed (for the Runs sidebar). */
export function liveState(runId: string | undefined): LiveRun | null {
  const follow = runId ? follows.get(runId) : undefined;
  return follow && follow.live ? follow.state : null;
}

/** Called on every live state of any run (the Runs sidebar refreshes its counts); returns the unsubscribe. */
export function onLiveState(listener: (run: LiveRun) => void): () => void {
  const hook = { listener };
  allListeners.add(hook);
  follows.forEach(follow => follow.listeners.add(listener));
  return () => {
    allListeners.delete(hook);
    follows.forEach(follow => follow.listeners.delete(listener));
  };
}

const allListeners = new Set<{ listener: (run: LiveRun) => void }>();

/** One renderer's link to its run: it shows what `show` gets, the MIME output or the live state. */
export class LiveLink {
  private follow: Follow | null = null;
  private node: HTMLElement | null = null;

  constructor(private readonly show: Show) {}

  /** The output's payload (renderModel): shows it, or the live state when that is newer; follows a live run. */
  offer(payload: LiveRun, node: HTMLElement): void {
    const runId = typeof payload.run_id === 'string' ? payload.run_id : null;
    if (!runId) {
      this.show(payload);
      return;
    }
    let follow = follows.get(runId);
    if (!follow) {
      follow = new Follow(runId);
      allListeners.forEach(hook => follow?.listeners.add(hook.listener));
      follows.set(runId, follow);
    }
    if (this.follow !== follow) {
      this.follow?.views.delete(this.show);
      this.follow = follow;
      follow.views.add(this.show);
    }
    this.node = node;
    const shown = follow.offer(payload);
    this.show(shown);
    this.connect();
  }

  /** Open the comm if the run is live and none is open (again once the output is in the page). */
  connect(): void {
    const follow = this.follow;
    if (!follow || !follow.state || follow.comm || !finder || !this.node || !isRunning(follow.state)) {
      return;
    }
    const kernel = finder(this.node);
    if (kernel) {
      follow.connect(kernel);
    }
  }

  dispose(): void {
    this.follow?.views.delete(this.show);
    this.follow = null;
  }
}

/** Forget every followed run (tests). */
export function resetLive(): void {
  follows.clear();
  allListeners.clear();
}
