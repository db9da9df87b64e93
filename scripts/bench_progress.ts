/**
 * The bench's progress on stderr: which stage of how many, how many of its tokens (or runs) are
 * done, and how long the bench has run, e.g.
 *
 *   bench [5/9] decode, batch 4 x 32 tokens: 57/128 tokens (41s)
 *
 * A stage that counts something rewrites its line in place (at most every 100 ms); one that does
 * not (loading, whose weights print their own bar) is a line of its own. Silent when stderr is
 * not a terminal, so logs and pipes get the table alone.
 */
import { formatDuration } from "./duration.ts";

/** Options of {@linkcode BenchProgress}. */
export interface BenchProgressOptions {
  /** Where the text goes (default: stderr when it is a terminal, else nowhere). */
  write?: ((text: string) => void) | null;
  /** Milliseconds between redraws of a counting line (default 100). */
  redrawMs?: number;
}

const encoder = new TextEncoder();

function defaultWrite(): ((text: string) => void) | null {
  return Deno.stderr.isTerminal() ? (text) => Deno.stderr.writeSync(encoder.encode(text)) : null;
}

/** Progress through a plan of `stages` stages; see the module doc. */
export class BenchProgress {
  #write: ((text: string) => void) | null;
  #redrawMs: number;
  #stage = 0;
  #label = "";
  #unit = "";
  #done = 0;
  #total = 0;
  #open = false;
  #drawn = 0;
  readonly #t0 = performance.now();

  /** @param stages how many times {@linkcode stage} will be called (it may be raised later) */
  constructor(public stages = 0, options: BenchProgressOptions = {}) {
    this.#write = options.write === undefined ? defaultWrite() : options.write;
    this.#redrawMs = options.redrawMs ?? 100;
  }

  /**
   * Starts the next stage. With `total`, it counts `unit`s ("tokens") done out of `total`
   * through {@linkcode tick}; without, it is one finished line.
   */
  stage(label: string, total = 0, unit = "tokens"): void {
    this.end();
    this.#stage++;
    this.#label = label;
    this.#unit = unit;
    this.#done = 0;
    this.#total = total;
    if (total > 0) {
      this.#open = true;
      this.#draw();
    } else this.#write?.(`${this.#line()}\n`);
  }

  /** `n` more units of the current stage are done. */
  tick(n = 1): void {
    this.#done += n;
    if (this.#open && performance.now() - this.#drawn >= this.#redrawMs) this.#draw();
  }

  /** Ends an open line with its final count (before a warning, the table, or the next stage). */
  end(): void {
    if (!this.#open) return;
    this.#draw();
    this.#write?.("\n");
    this.#open = false;
  }

  #line(): string {
    const count = this.#total > 0 ? `: ${this.#done}/${this.#total} ${this.#unit}` : "";
    const of = this.stages >= this.#stage ? `/${this.stages}` : "";
    const took = formatDuration(performance.now() - this.#t0);
    return `bench [${this.#stage}${of}] ${this.#label}${count} (${took})`;
  }

  #draw(): void {
    this.#drawn = performance.now();
    this.#write?.(`\r${this.#line()}\x1b[K`);
  }
}
