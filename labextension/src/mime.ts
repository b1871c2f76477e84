/**
 * The MIME renderer extension (package.json `jupyterlab.mimeExtension`), and the renderer factory that each
 * notebook gets from the `notebook-launcher-panel:live` plugin (index.ts) to follow running runs live.
 */

import type { IRenderMime } from '@jupyterlab/rendermime-interfaces';

import { ILiveOptions } from './live';
import { RunRenderer } from './renderer';
import { MIME_TYPE } from './schema';

export const RANK = 0;

/**
 * The renderer factory: with `live`, a panel follows its running run over a comm on the kernel `live.kernel`
 * finds; without, it shows the output as it is. Safe: the renderer only ever inserts text, so it also renders
 * in untrusted notebooks.
 */
export function createRendererFactory(
  live?: ILiveOptions
): IRenderMime.IRendererFactory {
  return {
    safe: true,
    mimeTypes: [MIME_TYPE],
    defaultRank: RANK,
    createRenderer: options => new RunRenderer(options, live)
  };
}

/** What JupyterLab registers for every output (a notebook's own registry replaces it: index.ts). */
export const rendererFactory = createRendererFactory();

/** The part of a `IRenderMimeRegistry` a notebook's live renderer is added to. */
export interface IFactoryRegistry {
  addFactory(factory: IRenderMime.IRendererFactory, rank?: number): void;
}

/** Give a notebook's registry the live renderer factory (replacing the plain one for this MIME type there). */
export function addLiveFactory(
  registry: IFactoryRegistry,
  live: ILiveOptions
): void {
  registry.addFactory(createRendererFactory(live), RANK);
}

const extension: IRenderMime.IExtension = {
  id: 'notebook-launcher-panel:renderer',
  rendererFactory,
  rank: RANK,
  dataType: 'json'
};

export default extension;
