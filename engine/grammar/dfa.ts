/**
 * From a byte NFA to the smallest deterministic automaton: subset construction over byte
 * intervals, removal of states that cannot reach acceptance, Hopcroft minimisation, then states
 * numbered breadth-first from the start and bytes grouped into classes that no state tells apart.
 */
import { GrammarError } from "./errors.ts";
import type { Nfa } from "./nfa.ts";

/** A deterministic byte automaton whose every state can reach an accepting one. */
export interface Dfa {
  /** Number of states S; the start is state 0. */
  states: number;
  /** Number of byte classes C. */
  classes: number;
  /** [256] byte → class. */
  classOf: Uint8Array;
  /** [S × C] next state, or -1 for "no such byte here". */
  trans: Int32Array;
  /** [S] 1 where the text read so far is a complete match. */
  accepting: Uint8Array;
}

/** Options for {@linkcode determinize}. */
export interface DeterminizeOptions {
  /** The most DFA states before stopping with a "too large" error. */
  maxStates?: number;
  /** Where errors point. */
  path?: string;
}

/**
 * The minimal DFA of the language from `start` to `accept` in `nfa`.
 *
 * @throws GrammarError when the language is empty or the automaton exceeds `maxStates`
 */
export function determinize(
  nfa: Nfa,
  ends: { start: number; accept: number },
  options: DeterminizeOptions = {},
): Dfa {
  const raw = subsets(nfa, ends, options.maxStates ?? 20_000, options.path ?? "");
  return minimize(trim(raw, options.path ?? ""));
}

/** Byte intervals no NFA edge splits: [256] byte → interval index. */
function intervals(nfa: Nfa): { classOf: Uint8Array; count: number } {
  const cut = new Uint8Array(257);
  for (const e of nfa.edges) {
    for (let i = 0; i < e.length; i += 3) cut[e[i]] = cut[e[i + 1] + 1] = 1;
  }
  const classOf = new Uint8Array(256);
  let c = -1;
  for (let b = 0; b < 256; b++) {
    if (cut[b] || b === 0) c++;
    classOf[b] = c;
  }
  return { classOf, count: c + 1 };
}

function subsets(
  nfa: Nfa,
  ends: { start: number; accept: number },
  maxStates: number,
  path: string,
): Dfa {
  const { classOf, count: C } = intervals(nfa);
  const mark = new Int32Array(nfa.eps.length).fill(-1);
  let stamp = 0;
  const closure = (seeds: number[]): number[] => {
    stamp++;
    const out: number[] = [];
    const stack = [...seeds];
    while (stack.length > 0) {
      const s = stack.pop()!;
      if (mark[s] === stamp) continue;
      mark[s] = stamp;
      if (nfa.edges[s].length > 0 || s === ends.accept) out.push(s);
      for (const t of nfa.eps[s]) if (mark[t] !== stamp) stack.push(t);
    }
    return out.sort((a, b) => a - b);
  };
  const ids = new Map<string, number>();
  const sets: number[][] = [];
  const trans: number[] = [];
  const add = (set: number[]): number => {
    const key = set.join(",");
    let id = ids.get(key);
    if (id === undefined) {
      if (sets.length >= maxStates) {
        throw new GrammarError(
          path,
          `the grammar is too large (more than ${maxStates} automaton states after ` +
            "determinisation); use fewer alternatives, smaller bounds or less nesting",
        );
      }
      id = sets.length;
      ids.set(key, id);
      sets.push(set);
    }
    return id;
  };
  add(closure([ends.start]));
  for (let d = 0; d < sets.length; d++) {
    const targets: number[][] = Array.from({ length: C }, () => []);
    for (const s of sets[d]) {
      const e = nfa.edges[s];
      for (let i = 0; i < e.length; i += 3) {
        for (let c = classOf[e[i]]; c <= classOf[e[i + 1]]; c++) targets[c].push(e[i + 2]);
      }
    }
    for (let c = 0; c < C; c++) {
      trans[d * C + c] = targets[c].length === 0 ? -1 : add(closure(targets[c]));
    }
  }
  const accepting = new Uint8Array(sets.length);
  sets.forEach((set, i) => accepting[i] = set.includes(ends.accept) ? 1 : 0);
  return { states: sets.length, classes: C, classOf, trans: Int32Array.from(trans), accepting };
}

/** `d` without the states that cannot reach acceptance (their edges become -1). */
function trim(d: Dfa, path: string): Dfa {
  const { states: S, classes: C } = d;
  const rev: number[][] = Array.from({ length: S }, () => []);
  for (let s = 0; s < S; s++) {
    for (let c = 0; c < C; c++) {
      const t = d.trans[s * C + c];
      if (t >= 0) rev[t].push(s);
    }
  }
  const live = new Uint8Array(S);
  const stack: number[] = [];
  for (let s = 0; s < S; s++) if (d.accepting[s]) live[s] = 1, stack.push(s);
  while (stack.length > 0) {
    for (const p of rev[stack.pop()!]) if (!live[p]) live[p] = 1, stack.push(p);
  }
  if (!live[0]) {
    throw new GrammarError(path, "the grammar matches no text at all; check its constraints");
  }
  const trans = d.trans.map((t) => t >= 0 && live[t] ? t : -1);
  return { ...d, trans };
}

/**
 * Hopcroft's partition refinement over the trimmed DFA plus one sink for the missing edges;
 * returns the quotient without the sink, states renumbered breadth-first from the start.
 */
function minimize(d: Dfa): Dfa {
  const { classes: C } = d;
  const S = d.states + 1; // + sink
  const sink = d.states;
  const next = (s: number, c: number) =>
    s === sink ? sink : (d.trans[s * C + c] < 0 ? sink : d.trans[s * C + c]);
  // inverse edges, CSR by (target, class)
  const invCount = new Int32Array(S * C + 1);
  for (let s = 0; s < S; s++) for (let c = 0; c < C; c++) invCount[next(s, c) * C + c + 1]++;
  for (let i = 1; i <= S * C; i++) invCount[i] += invCount[i - 1];
  const invList = new Int32Array(S * C);
  const fill = invCount.slice(0, S * C);
  for (let s = 0; s < S; s++) for (let c = 0; c < C; c++) invList[fill[next(s, c) * C + c]++] = s;
  // blocks: elems[start[b] .. end[b]) are the members of block b
  const elems = new Int32Array(S), pos = new Int32Array(S), blockOf = new Int32Array(S);
  const start: number[] = [], end: number[] = [];
  let k = 0;
  for (const acc of [1, 0]) {
    const begin = k;
    for (let s = 0; s < S; s++) {
      if ((s !== sink && d.accepting[s] === 1) === (acc === 1)) {
        elems[k] = s, pos[s] = k, blockOf[s] = start.length, k++;
      }
    }
    if (k > begin) start.push(begin), end.push(k);
  }
  const inWork: boolean[] = start.map(() => true);
  const work: number[] = start.map((_, i) => i);
  const marked = new Int32Array(S); // per block: members moved to the front
  const touched: number[] = [];
  while (work.length > 0) {
    const a = work.pop()!;
    inWork[a] = false;
    const members = Array.from(elems.subarray(start[a], end[a]));
    for (let c = 0; c < C; c++) {
      for (const t of members) {
        for (let i = invCount[t * C + c]; i < invCount[t * C + c + 1]; i++) {
          const q = invList[i], b = blockOf[q];
          const slot = start[b] + marked[b];
          if (pos[q] < slot) continue; // already marked
          if (marked[b] === 0) touched.push(b);
          const other = elems[slot];
          elems[slot] = q, elems[pos[q]] = other;
          pos[other] = pos[q], pos[q] = slot;
          marked[b]++;
        }
      }
      for (const b of touched) {
        const m = marked[b];
        marked[b] = 0;
        if (m === end[b] - start[b]) continue;
        const nb = start.length; // the marked part becomes block nb
        start.push(start[b]), end.push(start[b] + m);
        start[b] += m;
        for (let i = start[nb]; i < end[nb]; i++) blockOf[elems[i]] = nb;
        if (inWork[b]) inWork[nb] = true, work.push(nb);
        else {
          const smaller = end[nb] - start[nb] <= end[b] - start[b] ? nb : b;
          inWork[smaller] = true, work.push(smaller);
        }
      }
      touched.length = 0;
    }
  }
  return renumber(d, blockOf, blockOf[sink]);
}

/** The quotient by `blockOf`, breadth-first from the start, classes merged where equal. */
function renumber(d: Dfa, blockOf: Int32Array, sinkBlock: number): Dfa {
  const C0 = d.classes;
  const order = new Map<number, number>();
  const reps: number[] = [];
  const visit = (s: number) => {
    const b = blockOf[s];
    if (!order.has(b)) order.set(b, reps.length), reps.push(s);
  };
  visit(0);
  for (let i = 0; i < reps.length; i++) {
    for (let c = 0; c < C0; c++) {
      const t = d.trans[reps[i] * C0 + c];
      if (t >= 0 && blockOf[t] !== sinkBlock) visit(t);
    }
  }
  const S = reps.length;
  const id = (t: number) => t < 0 || blockOf[t] === sinkBlock ? -1 : order.get(blockOf[t])!;
  // merge interval classes whose columns are equal
  const colKey = (c: number) => reps.map((s) => id(d.trans[s * C0 + c])).join(",");
  const classIds = new Map<string, number>();
  const newClass = new Int32Array(C0);
  const firstOld: number[] = [];
  for (let b = 0; b < 256; b++) {
    const c = d.classOf[b];
    if (b > 0 && d.classOf[b - 1] === c) continue;
    const key = colKey(c);
    let nc = classIds.get(key);
    if (nc === undefined) nc = classIds.size, classIds.set(key, nc), firstOld.push(c);
    newClass[c] = nc;
  }
  const C = classIds.size;
  const classOf = d.classOf.map((c) => newClass[c]);
  const trans = new Int32Array(S * C);
  const accepting = new Uint8Array(S);
  reps.forEach((s, i) => {
    accepting[i] = d.accepting[s];
    for (let c = 0; c < C; c++) trans[i * C + c] = id(d.trans[s * C0 + firstOld[c]]);
  });
  return { states: S, classes: C, classOf, trans, accepting };
}

/** The state after reading `bytes` from `state`, or -1 when the DFA rejects them. */
export function walk(d: Dfa, state: number, bytes: ArrayLike<number>): number {
  let s = state;
  for (let i = 0; i < bytes.length && s >= 0; i++) s = d.trans[s * d.classes + d.classOf[bytes[i]]];
  return s;
}

/** Whether `d` matches all of `bytes`. */
export function matches(d: Dfa, bytes: ArrayLike<number>): boolean {
  const s = walk(d, 0, bytes);
  return s >= 0 && d.accepting[s] === 1;
}
