/** Number and time formatting shared by the panel and the sidebar. */

import type { IProgress, IRank, IRun } from './schema';

/** "3.2 s", "2 min 05 s", "1 h 02 min". */
export function formatElapsed(seconds: number | null | undefined): string {
  if (typeof seconds !== 'number' || !isFinite(seconds) || seconds < 0) {
    return '';
  }
  if (seconds < 60) {
    return `${seconds.toFixed(1)} s`;
  }
  const whole = Math.floor(seconds);
  const pad = (v: number) => String(v).padStart(2, '0');
  if (whole < 3600) {
    return `${Math.floor(whole / 60)} min ${pad(whole % 60)} s`;
  }
  return `${Math.floor(whole / 3600)} h ${pad(Math.floor((whole % 3600) / 60))} min`;
}

/** Metric values: 4 significant digits, exponent form for very small or large values. */
export function formatNumber(value: unknown): string {
  if (typeof value !== 'number') {
    return String(value);
  }
  if (!isFinite(value) || Number.isInteger(value)) {
    return String(value);
  }
  const abs = Math.abs(value);
  if (abs !== 0 && (abs < 1e-3 || abs >= 1e5)) {
    return value.toExponential(2);
  }
  return String(Number(value.toPrecision(4)));
}

/** "step 40/100 · loss 0.31 · 0.051 s/step". */
export function formatProgress(progress: IProgress | null | undefined): string {
  if (!progress) {
    return '';
  }
  const parts: string[] = [];
  if (typeof progress.step === 'number') {
    parts.push(
      typeof progress.total === 'number'
        ? `step ${progress.step}/${progress.total}`
        : `step ${progress.step}`
    );
  }
  for (const [name, value] of Object.entries(progress.metrics || {})) {
    parts.push(`${name} ${formatNumber(value)}`);
  }
  if (typeof progress.step_time === 'number') {
    parts.push(`${formatNumber(progress.step_time)} s/step`);
  }
  return parts.join(' · ');
}

/** Fraction done in [0, 1], or null when there is no total. */
export function progressFraction(
  progress: IProgress | null | undefined
): number | null {
  if (
    !progress ||
    typeof progress.step !== 'number' ||
    typeof progress.total !== 'number' ||
    progress.total <= 0
  ) {
    return null;
  }
  return Math.max(0, Math.min(1, progress.step / progress.total));
}

/** How many ranks are in each status. */
export function rankCounts(run: IRun): Record<string, number> {
  const counts: Record<string, number> = {};
  for (const rank of run.ranks || []) {
    const status = rank.status || 'unknown';
    counts[status] = (counts[status] || 0) + 1;
  }
  return counts;
}

/** The slowest rank's progress: what the whole run waits for. */
export function slowestProgress(ranks: IRank[] | undefined): IProgress | null {
  let slowest: IProgress | null = null;
  for (const rank of ranks || []) {
    const p = rank.progress;
    if (
      p &&
      typeof p.step === 'number' &&
      (!slowest || p.step < (slowest.step as number))
    ) {
      slowest = p;
    }
  }
  return slowest;
}
