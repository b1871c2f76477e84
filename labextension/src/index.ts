/**
 * The extension's plugins (package.json `jupyterlab.extension`; the MIME renderer is `jupyterlab.mimeExtension`,
 * mime.ts):
 *
 * - `notebook-launcher-panel:live` provides `ILiveRuns` (live.ts), the runs the page follows over their comms,
 *   and gives each notebook a renderer factory that has it and that notebook's kernel. Without this plugin the
 *   panels show the saved output (the MIME extension's own factory).
 * - `notebook-launcher-panel:sidebar`, the "Runs" sidebar (sidebar.ts), reads `ILiveRuns` if it is there for
 *   the newest state of a followed run (and to stop a detached run, after JupyterLab's dialog asks); without it,
 *   the outputs'.
 */

import {
  ILayoutRestorer,
  JupyterFrontEnd,
  JupyterFrontEndPlugin
} from '@jupyterlab/application';
import { INotebookTracker } from '@jupyterlab/notebook';
import { Dialog, showDialog } from '@jupyterlab/apputils';

import { IKernelLike, ILiveRuns, LiveRuns } from './live';
import { addLiveFactory, IFactoryRegistry } from './mime';
import { RunsSidebar, SIDEBAR_ID } from './sidebar';

/** The widget factory name of JupyterLab's notebooks. */
const NOTEBOOK = 'Notebook';

/** What the live plugin reads of a notebook panel (a `NotebookPanel`) and of its context. */
export interface INotebookLike {
  content: { rendermime: IFactoryRegistry };
}
export interface IContextLike {
  sessionContext: { session?: { kernel?: unknown } | null };
}

/**
 * A new notebook's outputs get the live renderer: its panels open their comms on this notebook's kernel (the one
 * its session has when a panel connects).
 */
export function followInNotebook(
  panel: INotebookLike,
  context: IContextLike,
  runs: ILiveRuns
): void {
  const kernel = () =>
    (context.sessionContext.session?.kernel as
      IKernelLike | null | undefined) ?? null;
  addLiveFactory(panel.content.rendermime, { runs, kernel });
}

const livePlugin: JupyterFrontEndPlugin<ILiveRuns> = {
  id: 'notebook-launcher-panel:live',
  description:
    'Follows running notebook_launcher runs over their comms: the live run panel in notebooks.',
  autoStart: true,
  provides: ILiveRuns,
  activate: (app: JupyterFrontEnd): ILiveRuns => {
    const runs = new LiveRuns();
    // a widget extension runs as each notebook panel is made, before its outputs are rendered
    app.docRegistry.addWidgetExtension(NOTEBOOK, {
      createNew: (panel, context) =>
        followInNotebook(panel as unknown as INotebookLike, context, runs)
    });
    return runs;
  }
};

/** JupyterLab's dialog: stop the run? (The sidebar's stop button asks it first.) */
export async function askToStop(runId: string): Promise<boolean> {
  const answer = await showDialog({
    title: 'Stop this run?',
    body: `Run ${runId} goes on outside the kernel. Stopping it ends every rank, as run.stop() does.`,
    buttons: [
      Dialog.cancelButton(),
      Dialog.warnButton({ label: 'Stop', ariaLabel: 'Stop the run' })
    ]
  });
  return answer.button.accept;
}

const sidebarPlugin: JupyterFrontEndPlugin<void> = {
  id: 'notebook-launcher-panel:sidebar',
  description:
    'The "Runs" sidebar: every notebook_launcher run in the open notebooks.',
  autoStart: true,
  requires: [INotebookTracker],
  optional: [ILiveRuns, ILayoutRestorer],
  activate: (
    app: JupyterFrontEnd,
    tracker: INotebookTracker,
    live: ILiveRuns | null,
    restorer: ILayoutRestorer | null
  ) => {
    const sidebar = new RunsSidebar(tracker, app.shell, live, askToStop);
    app.shell.add(sidebar, 'left', { rank: 700 });
    restorer?.add(sidebar, SIDEBAR_ID);
  }
};

export default [livePlugin, sidebarPlugin];
