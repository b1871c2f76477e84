/**
 * Tiny DOM helpers. Text always goes in through `textContent`, never `innerHTML`, so user text
 * (log lines, tracebacks, metric names) can never become markup: that is what lets the renderer be `safe`.
 */

const SVG_NS = 'http://www.w3.org/2000/svg';

/** Create an element with a class and optional text. */
export function h<K extends keyof HTMLElementTagNameMap>(
  tag: K,
  className?: string,
  text?: string | number | null
): HTMLElementTagNameMap[K] {
  const node = document.createElement(tag);
  if (className) {
    node.className = className;
  }
  if (text !== undefined && text !== null) {
    node.textContent = String(text);
  }
  return node;
}

/** Create an SVG element with attributes (numbers and our own strings only). */
export function s<K extends keyof SVGElementTagNameMap>(
  tag: K,
  attrs: Record<string, string | number> = {}
): SVGElementTagNameMap[K] {
  const node = document.createElementNS(SVG_NS, tag);
  for (const [key, value] of Object.entries(attrs)) {
    node.setAttribute(key, String(value));
  }
  return node;
}

/** Set or remove data attributes in one go; `null`/`undefined` removes. */
export function setData(
  node: HTMLElement | SVGElement,
  data: Record<string, unknown>
): void {
  for (const [key, value] of Object.entries(data)) {
    if (value === null || value === undefined) {
      delete node.dataset[key];
    } else {
      node.dataset[key] = String(value);
    }
  }
}

/** A status badge: `.nl-badge[data-status]`, coloured by CSS. */
export function badge(
  status: string | undefined,
  className = ''
): HTMLSpanElement {
  const value = status || 'unknown';
  const node = h('span', `nl-badge ${className}`.trim(), value);
  node.dataset.status = value;
  return node;
}
