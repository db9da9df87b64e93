/**
 * A nondeterministic byte automaton (Thompson's construction) and the pieces grammars are built
 * from. A {@linkcode Frag} is a recipe, not a graph: placing it builds fresh states, so one piece
 * (a JSON string, a counted item) can be placed many times.
 *
 * Invariant every Frag keeps: it adds no edge into its `from` state (loops go through a fresh
 * state), so a caller may hang other paths off `from` and off the state a Frag returns.
 */
import { GrammarError } from "./errors.ts";
import { type ByteSequence, type Ranges, utf8Sequences } from "./utf8.ts";

/** Byte automaton under construction: per state, ε-moves and byte-range edges. */
export class Nfa {
  /** ε-successors of each state. */
  readonly eps: number[][] = [];
  /** Byte edges of each state as flat (lo, hi, to) triples, lo..hi inclusive. */
  readonly edges: number[][] = [];
  readonly #limit: number;
  readonly #path: string;

  /**
   * @param limit the most states before compilation stops with a "too large" error
   * @param path where errors point (the request field of the grammar)
   */
  constructor(limit = 400_000, path = "") {
    this.#limit = limit;
    this.#path = path;
  }

  /** A new state's id. */
  state(): number {
    if (this.eps.length >= this.#limit) {
      throw new GrammarError(
        this.#path,
        `the grammar is too large (more than ${this.#limit} automaton states); use fewer or ` +
          "shorter enums and literals, smaller maxLength/maxItems/repetition bounds, or less nesting",
      );
    }
    this.eps.push([]);
    this.edges.push([]);
    return this.eps.length - 1;
  }

  /** ε-move `from` → `to`. */
  epsilon(from: number, to: number): void {
    this.eps[from].push(to);
  }

  /** Edge `from` → `to` on any byte in lo..hi. */
  bytes(from: number, lo: number, hi: number, to: number): void {
    this.edges[from].push(lo, hi, to);
  }
}

/** A piece of grammar: builds its states from `from` and returns the state where it ends. */
export type Frag = (n: Nfa, from: number) => number;

/** The empty string. */
export const empty: Frag = (_n, from) => from;

/** No string at all (an alternative that can never be taken). */
export const nothing: Frag = (n) => n.state();

/** One byte in lo..hi. */
export function byteRange(lo: number, hi: number): Frag {
  return (n, from) => {
    const to = n.state();
    n.bytes(from, lo, hi, to);
    return to;
  };
}

const encoder = new TextEncoder();

/** The exact bytes of `text` (UTF-8 for a string). */
export function literal(text: string | Uint8Array): Frag {
  const bytes = typeof text === "string" ? encoder.encode(text) : text;
  return (n, from) => {
    let at = from;
    for (const b of bytes) {
      const to = n.state();
      n.bytes(at, b, b, to);
      at = to;
    }
    return at;
  };
}

/** Any one code point of `ranges`, as its UTF-8 bytes. */
export function codePoints(ranges: Ranges): Frag {
  const seqs: ByteSequence[] = utf8Sequences(ranges);
  return (n, from) => {
    const end = n.state();
    for (const seq of seqs) {
      let at = from;
      seq.forEach(([lo, hi], i) => {
        const to = i === seq.length - 1 ? end : n.state();
        n.bytes(at, lo, hi, to);
        at = to;
      });
    }
    return end;
  };
}

/** The pieces one after another. */
export function seq(...parts: Frag[]): Frag {
  return (n, from) => parts.reduce((at, f) => f(n, at), from);
}

/** Any one of the pieces. */
export function alt(...parts: Frag[]): Frag {
  if (parts.length === 1) return parts[0];
  return (n, from) => {
    const end = n.state();
    for (const f of parts) n.epsilon(f(n, from), end);
    return end;
  };
}

/** The piece or nothing. */
export function opt(f: Frag): Frag {
  return (n, from) => {
    const end = n.state();
    n.epsilon(from, end);
    n.epsilon(f(n, from), end);
    return end;
  };
}

/** The piece any number of times (Kleene star). */
export function star(f: Frag): Frag {
  return (n, from) => {
    const loop = n.state();
    n.epsilon(from, loop);
    n.epsilon(f(n, loop), loop);
    return loop;
  };
}

/**
 * The piece `min` to `max` times (`max` undefined: unbounded). Bounded repetition is unrolled:
 * `max` copies of the piece.
 */
export function repeat(f: Frag, min: number, max?: number): Frag {
  return (n, from) => {
    let at = from;
    for (let i = 0; i < min; i++) at = f(n, at);
    if (max === undefined) return star(f)(n, at);
    const end = n.state();
    n.epsilon(at, end);
    for (let i = min; i < max; i++) {
      at = f(n, at);
      n.epsilon(at, end);
    }
    return end;
  };
}

/**
 * `item (sep item)*` with the count of items in min..max (max undefined: unbounded; min 0 allows
 * no item at all). The separator sits between items only.
 */
export function separated(item: Frag, sep: Frag, min: number, max?: number): Frag {
  if (max !== undefined && max === 0) return empty;
  const rest = (lo: number, hi?: number) => repeat(seq(sep, item), lo, hi);
  const some = seq(item, rest(Math.max(min - 1, 0), max === undefined ? undefined : max - 1));
  return min === 0 ? opt(some) : some;
}
