/**
 * Stop strings over streamed text: emits text as soon as it cannot be the start of a stop
 * string, and reports where the first stop string begins.
 */

/** Result of {@linkcode StopMatcher.push}. */
export interface StopResult {
  /** Text safe to emit now. */
  text: string;
  /** True when a stop string matched; `text` ends just before it. */
  stopped: boolean;
}

/** Holds back the tail of the text that could still grow into a stop string. */
export class StopMatcher {
  #pending = "";

  constructor(readonly stops: string[]) {}

  /** Adds new text; returns what may be emitted. */
  push(piece: string): StopResult {
    this.#pending += piece;
    const p = this.#pending;
    let first = -1;
    for (const s of this.stops) {
      const i = s ? p.indexOf(s) : -1;
      if (i >= 0 && (first < 0 || i < first)) first = i;
    }
    if (first >= 0) {
      this.#pending = "";
      return { text: p.slice(0, first), stopped: true };
    }
    let hold = 0;
    for (const s of this.stops) {
      for (let n = Math.min(s.length - 1, p.length); n > hold; n--) {
        if (p.endsWith(s.slice(0, n))) {
          hold = n;
          break;
        }
      }
    }
    this.#pending = p.slice(p.length - hold);
    return { text: p.slice(0, p.length - hold), stopped: false };
  }

  /** Everything still held back (at the end of generation). */
  flush(): string {
    const p = this.#pending;
    this.#pending = "";
    return p;
  }
}
