/** The MIME renderer extension (package.json `jupyterlab.mimeExtension`). */

import type { IRenderMime } from '@jupyterlab/rendermime-interfaces';

import { RunRenderer } from './renderer';
import { MIME_TYPE } from './schema';

/** Safe: the renderer only ever inserts text, so it also renders in untrusted notebooks. */
export const rendererFactory: IRenderMime.IRendererFactory = {
  safe: true,
  mimeTypes: [MIME_TYPE],
  defaultRank: 0,
  createRenderer: options => new RunRenderer(options)
};

const extension: IRenderMime.IExtension = {
  id: 'notebook-launcher-panel:renderer',
  rendererFactory,
  rank: 0,
  dataType: 'json'
};

export default extension;
