/** Progress on stderr for long work (model loading, benchmarks); silent when stderr is no TTY. */

const enc = new TextEncoder();

/** A one-line progress bar that rewrites itself at most every 100 ms. */
export class Progress {
  #done = 0;
  #last = 0;
  readonly #tty = Deno.stderr.isTerminal();

  constructor(readonly label: string, readonly total: number) {}

  /** Adds `n` units of finished work. */
  add(n: number): void {
    this.#done += n;
    const now = performance.now();
    if (!this.#tty || now - this.#last < 100) return;
    this.#last = now;
    const pct = this.total > 0 ? Math.min(100, (100 * this.#done) / this.total) : 0;
    const mb = (this.#done / 1e6).toFixed(0);
    Deno.stderr.writeSync(enc.encode(`\r${this.label}: ${pct.toFixed(0)}% (${mb} MB)`));
  }

  /** Ends the line. */
  done(): void {
    if (this.#tty) Deno.stderr.writeSync(enc.encode(`\r${this.label}: done\x1b[K\n`));
  }
}

/** Logs a status line to stderr when it is a TTY (or always, with `force`). */
export function status(message: string, force = false): void {
  if (force || Deno.stderr.isTerminal()) console.error(message);
}
