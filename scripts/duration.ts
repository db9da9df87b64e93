/** Durations as the scripts' progress and summary lines show them. */

/** "41s", "12m 3s" (rounded to the second). */
export function formatDuration(ms: number): string {
  const s = Math.round(ms / 1000);
  return s < 60 ? `${s}s` : `${Math.floor(s / 60)}m ${s % 60}s`;
}
