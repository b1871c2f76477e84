import { Signal } from '@lumino/signaling';
import { describe, expect, it, vi } from 'vitest';

import plugins from '../src/index';
import { ICommLike, ILiveRuns, LiveRuns } from '../src/live';
import mimeExtension, { rendererFactory } from '../src/mime';
import { RunRenderer } from '../src/renderer';
import { MIME_TYPE } from '../src/schema';
import { rank, run } from './fixtures';

// As in sidebar.test.ts: the tokens and LabIcon only (the real packages do not load in jsdom).
vi.mock('@jupyterlab/application', () => ({
  ILayoutRestorer: { name: 'ILayoutRestorer' }
}));
vi.mock('@jupyterlab/notebook', () => ({
  INotebookTracker: { name: 'INotebookTracker' }
}));
vi.mock('@jupyterlab/ui-components', () => ({ LabIcon: class {} }));
vi.mock('@jupyterlab/apputils', () => ({ Dialog: {}, showDialog: vi.fn() }));

const [livePlugin, sidebarPlugin] = plugins;

class FakeKernel {
  comms: ICommLike[] = [];
  createComm(): ICommLike {
    const comm = { open: vi.fn(), send: vi.fn(), onMsg: null, onClose: null };
    this.comms.push(comm);
    return comm;
  }
}

function render(
  factory: typeof rendererFactory,
  payload: unknown
): RunRenderer {
  const renderer = factory.createRenderer({} as never) as RunRenderer;
  void renderer.renderModel({ data: { [MIME_TYPE]: payload } } as never);
  return renderer;
}

describe('the plugins', () => {
  it('say what depends on what: the live plugin provides ILiveRuns, the sidebar takes it if it is there', () => {
    expect([
      livePlugin.id,
      livePlugin.provides,
      livePlugin.requires ?? [],
      livePlugin.autoStart
    ]).toEqual(['notebook-launcher-panel:live', ILiveRuns, [], true]);
    expect(sidebarPlugin.id).toBe('notebook-launcher-panel:sidebar');
    expect(sidebarPlugin.requires).toHaveLength(1); // INotebookTracker
    expect(sidebarPlugin.optional).toContain(ILiveRuns);
    expect([mimeExtension.id, mimeExtension.rendererFactory]).toEqual([
      'notebook-launcher-panel:renderer',
      rendererFactory
    ]);
  });

  it("give each new notebook a live renderer that opens its comm on that notebook's kernel", () => {
    const extensions: [string, any][] = [];
    const app = {
      docRegistry: {
        addWidgetExtension: (name: string, ext: any) =>
          extensions.push([name, ext])
      }
    };
    const runs = livePlugin.activate(app as never) as LiveRuns;
    expect(runs).toBeInstanceOf(LiveRuns);
    expect(extensions.map(([name]) => name)).toEqual(['Notebook']);
    const added: [any, number | undefined][] = [];
    const panel = {
      content: {
        rendermime: { addFactory: (f: any, r?: number) => added.push([f, r]) }
      }
    };
    const context = {
      sessionContext: { session: null as null | { kernel: FakeKernel } }
    };
    extensions[0][1].createNew(panel, context);
    expect(added).toHaveLength(1);
    const [factory, rankGiven] = added[0];
    expect([factory.safe, factory.mimeTypes, rankGiven]).toEqual([
      true,
      [MIME_TYPE],
      mimeExtension.rank
    ]);
    const kernel = new FakeKernel();
    context.sessionContext.session = { kernel }; // the kernel the session has when the panel connects
    render(factory, run({ ranks: [rank(0)] }));
    expect(kernel.comms).toHaveLength(1);
  });

  it("the MIME extension's own factory shows the output alone (it has no ILiveRuns)", () => {
    const renderer = render(rendererFactory, run({ ranks: [rank(0)] }));
    expect(rendererFactory.safe).toBe(true);
    expect(
      renderer.node.querySelector('.nl-run')?.getAttribute('data-status')
    ).toBe('running');
  });

  it('the sidebar starts without ILiveRuns', () => {
    const added: unknown[] = [];
    const app = {
      shell: {
        add: (widget: unknown, area: string) => added.push([widget, area])
      }
    };
    const tracker = {
      forEach: () => undefined,
      widgetAdded: new Signal<any, any>({})
    };
    sidebarPlugin.activate(app as never, tracker, null, null);
    expect(added).toHaveLength(1);
    const [widget, area] = added[0] as [
      { id: string; dispose(): void },
      string
    ];
    expect([widget.id, area]).toEqual(['notebook-launcher-runs', 'left']);
    widget.dispose();
  });
});
