/**
 * The token-level tables of a grammar for one vocabulary, as one u32 image the GPU reads: which
 * tokens each state allows (a mask row of deduplicated 1024-token blocks), the byte automaton the
 * step kernel walks a sampled token's bytes through, and per state the tokens still needed to
 * finish, so a slot can be steered to a complete output within its token budget.
 *
 * Image layout (u32 words; offsets are words from the image's first word, so images can be
 * concatenated into one buffer and addressed from a per-slot base):
 *
 * | words            | meaning                                                                 |
 * | ---------------- | ----------------------------------------------------------------------- |
 * | header [16]      | {@linkcode Header}: magic, version, S, C, V, B, R, N, offsets, start, minTokens |
 * | class [64]       | byte b's class: `(w[b >> 2] >> 8 (b & 3)) & 0xff`                        |
 * | trans [S × C]    | next state of (state, class); {@linkcode DEAD} where the byte is refused |
 * | state [S × 4]    | allowed row, finish row, dist, maxNext (see {@linkcode StateRecord})      |
 * | rows [R × B]     | block id of each 1024-token block of a row (block 0 = no token)          |
 * | blocks [N × 32]  | 1024-bit masks: token i of block k is bit `i & 31` of word `(i >> 5) & 31` |
 *
 * Token t is allowed in state s when the bit of t is set in block `rows[row(s) × B + (t >> 10)]`.
 * EOS ids are allowed exactly in accepting states (dist 0). After a non-EOS token the next state
 * is the walk of the token's bytes (vocab.ts `tokenBytesImage`) through `trans`; it is never DEAD
 * for an allowed token.
 */
import type { Dfa } from "./dfa.ts";
import { GrammarError } from "./errors.ts";
import {
  BLOCK_TOKENS,
  BLOCK_WORDS,
  BlockStore,
  setRow,
  type TokenSet,
  tokenSet,
  union,
} from "./token_sets.ts";
import { byteTrie, type Vocabulary } from "./vocab.ts";

/** Word 0 of every image ("GRM1"). */
export const GRAMMAR_MAGIC = 0x314d5247;
/** Layout version (word 1). */
export const GRAMMAR_VERSION = 1;
/** A refused byte in `trans`; also `dist` of a state no token reaches. */
export const DEAD = 0xffffffff;
/** Words of the header. */
export const HEADER_WORDS = 16;
/** Words of a state record. */
export const STATE_WORDS = 4;

/** Header word indices. */
export const Header = {
  magic: 0,
  version: 1,
  /** States S. */
  states: 2,
  /** Byte classes C. */
  classes: 3,
  /** Mask width V (the model's vocabulary). */
  vocab: 4,
  /** Blocks per row B = ceil(V / 1024). */
  rowBlocks: 5,
  /** Rows R. */
  rows: 6,
  /** Blocks N. */
  blocks: 7,
  classOffset: 8,
  transOffset: 9,
  stateOffset: 10,
  rowsOffset: 11,
  blocksOffset: 12,
  /** Total words of the image. */
  words: 13,
  /** The start state (0). */
  start: 14,
  /** Fewest tokens from the start to an accepting state: max_tokens must be at least this. */
  minTokens: 15,
} as const;

/** Word indices inside a state record. */
export const StateRecord = {
  /** Row of the tokens allowed here. */
  allowedRow: 0,
  /**
   * Row used when the budget is tight: in an accepting state EOS only, else the tokens that lead
   * to a state one token closer to acceptance.
   */
  finishRow: 1,
  /** Fewest tokens to an accepting state (0: accepting; DEAD: never current). */
  dist: 2,
  /** The largest `dist` any allowed non-EOS token leads to (0 when none). */
  maxNext: 3,
} as const;

/** A grammar's tables for one vocabulary. */
export interface GrammarTables {
  /** The image (layout above). */
  image: Uint32Array<ArrayBuffer>;
  /** Byte size of the image. */
  bytes: number;
  states: number;
  classes: number;
  rows: number;
  blocks: number;
  /** States some token sequence reaches from the start. */
  reachable: number;
  /** Fewest tokens to a complete output (header word minTokens). */
  minTokens: number;
}

/**
 * The tables of `dfa` over `vocab`.
 *
 * @param path where errors point
 * @throws GrammarError when the vocabulary cannot spell any complete output from the start
 */
export function buildTables(dfa: Dfa, vocab: Vocabulary, path = ""): GrammarTables {
  const S = dfa.states, V = vocab.size, B = Math.ceil(V / BLOCK_TOKENS);
  const store = new BlockStore();
  const succ = successors(dfa, vocab, store);
  const dist = distances(dfa, succ);
  if (dist[0] === DEAD) {
    throw new GrammarError(
      path,
      "this model's vocabulary cannot spell a complete output of the grammar",
    );
  }
  const eos = tokenSet(store, vocab.eosIds);
  if (vocab.eosIds.length === 0) {
    throw new GrammarError(path, "constrained decoding needs a model with an EOS token");
  }
  const rowIds = new Map<string, number>([[new Uint32Array(B).join(","), 0]]);
  const rows: Uint32Array[] = [new Uint32Array(B)];
  const rowOf = (set: TokenSet) => {
    const row = setRow(set, B), key = row.join(",");
    let id = rowIds.get(key);
    if (id === undefined) rowIds.set(key, id = rows.length), rows.push(row);
    return id;
  };
  const record = new Uint32Array(S * STATE_WORDS);
  let reachable = 0;
  for (let s = 0; s < S; s++) {
    const at = s * STATE_WORDS;
    record[at + StateRecord.dist] = dist[s];
    const edges = succ[s];
    if (edges === undefined || dist[s] === DEAD) continue;
    reachable++;
    const live = edges.filter((e) => dist[e.to] !== DEAD);
    const accepting = dfa.accepting[s] === 1;
    const allowed = live.map((e) => e.set);
    if (accepting) allowed.push(eos);
    record[at + StateRecord.allowedRow] = rowOf(union(store, allowed));
    const closer = live.filter((e) => dist[e.to] === dist[s] - 1).map((e) => e.set);
    record[at + StateRecord.finishRow] = rowOf(accepting ? eos : union(store, closer));
    record[at + StateRecord.maxNext] = live.reduce((m, e) => Math.max(m, dist[e.to]), 0);
  }
  return assemble({
    dfa,
    V,
    B,
    record,
    rows,
    blocks: store.words(),
    reachable,
    minTokens: dist[0],
  });
}

/** One token-level edge group: the tokens that take a state to `to`. */
interface Edge {
  to: number;
  set: TokenSet;
}

/**
 * For every state reachable by tokens from the start: its token edges, grouped by target. One
 * forward scan of the trie per state (pre-order: a node's parent is already done), a refused
 * byte skipping its whole subtree. Each target's tokens collect in a dense bitmask (one per
 * target, reused across states), cut into blocks at the end.
 */
function successors(dfa: Dfa, vocab: Vocabulary, store: BlockStore): (Edge[] | undefined)[] {
  const trie = byteTrie(vocab);
  const { trans, classOf, classes: C } = dfa;
  const { parent, byte, size, tokenStart, tokenIds, nodes } = trie;
  const W = Math.ceil(vocab.size / BLOCK_TOKENS) * BLOCK_WORDS;
  const out: (Edge[] | undefined)[] = new Array(dfa.states);
  const order = [0];
  out[0] = [];
  const at = new Int32Array(nodes); // the automaton's state after each node's bytes
  // each trie edge's byte class in this automaton, so the scan reads one array less per node
  const edgeClass = new Uint8Array(nodes);
  for (let n = 1; n < nodes; n++) edgeClass[n] = classOf[byte[n]];
  const masks: Uint32Array[] = []; // scratch bitmasks, one per target of the current state
  const slot = new Int32Array(dfa.states).fill(-1); // target → scratch index
  const targets: number[] = [];
  for (let i = 0; i < order.length; i++) {
    at[0] = order[i];
    for (let n = 1; n < nodes;) {
      const q = trans[at[parent[n]] * C + edgeClass[n]];
      if (q < 0) {
        n += size[n];
        continue;
      }
      at[n] = q;
      const t1 = tokenStart[n + 1];
      let t = tokenStart[n];
      if (t < t1) {
        let k = slot[q];
        if (k < 0) {
          k = slot[q] = targets.length;
          targets.push(q);
          if (masks.length <= k) masks.push(new Uint32Array(W));
        }
        const m = masks[k];
        for (; t < t1; t++) m[tokenIds[t] >> 5] |= 1 << (tokenIds[t] & 31);
      }
      n++;
    }
    const edges: Edge[] = [];
    targets.forEach((to, k) => {
      edges.push({ to, set: maskSet(store, masks[k]) });
      masks[k].fill(0);
      slot[to] = -1;
      if (out[to] === undefined) out[to] = [], order.push(to);
    });
    targets.length = 0;
    out[order[i]] = edges;
  }
  return out;
}

/** The token set of a dense bitmask (whole blocks). */
function maskSet(store: BlockStore, mask: Uint32Array): TokenSet {
  const set: TokenSet = [];
  for (let w = 0, blk = 0; w < mask.length; w += BLOCK_WORDS, blk++) {
    let any = 0;
    for (let j = w; j < w + BLOCK_WORDS; j++) any |= mask[j];
    if (any !== 0) set.push(blk, store.intern(mask.subarray(w, w + BLOCK_WORDS)));
  }
  return set;
}

/** Fewest tokens from each state to an accepting one (DEAD when none), by backward BFS. */
function distances(dfa: Dfa, succ: (Edge[] | undefined)[]): Uint32Array {
  const S = dfa.states;
  const rev: number[][] = Array.from({ length: S }, () => []);
  succ.forEach((edges, s) => edges?.forEach((e) => rev[e.to].push(s)));
  const dist = new Uint32Array(S).fill(DEAD);
  let frontier: number[] = [];
  for (let s = 0; s < S; s++) {
    if (succ[s] !== undefined && dfa.accepting[s]) dist[s] = 0, frontier.push(s);
  }
  for (let d = 1; frontier.length > 0; d++) {
    const next: number[] = [];
    for (const t of frontier) {
      for (const p of rev[t]) if (dist[p] === DEAD) dist[p] = d, next.push(p);
    }
    frontier = next;
  }
  return dist;
}

function assemble(o: {
  dfa: Dfa;
  V: number;
  B: number;
  record: Uint32Array;
  rows: Uint32Array[];
  blocks: Uint32Array;
  reachable: number;
  minTokens: number;
}): GrammarTables {
  const { dfa, V, B, record, rows, blocks } = o;
  const S = dfa.states, C = dfa.classes, R = rows.length, N = blocks.length / BLOCK_WORDS;
  const classOffset = HEADER_WORDS;
  const transOffset = classOffset + 64;
  const stateOffset = transOffset + S * C;
  const rowsOffset = stateOffset + S * STATE_WORDS;
  const blocksOffset = rowsOffset + R * B;
  const words = blocksOffset + blocks.length;
  const image = new Uint32Array(words);
  image.set([
    GRAMMAR_MAGIC,
    GRAMMAR_VERSION,
    S,
    C,
    V,
    B,
    R,
    N,
    classOffset,
    transOffset,
    stateOffset,
    rowsOffset,
    blocksOffset,
    words,
    0,
    o.minTokens,
  ]);
  dfa.classOf.forEach((c, b) => image[classOffset + (b >> 2)] |= c << (8 * (b & 3)));
  for (let i = 0; i < S * C; i++) image[transOffset + i] = dfa.trans[i] < 0 ? DEAD : dfa.trans[i];
  image.set(record, stateOffset);
  rows.forEach((row, r) => image.set(row, rowsOffset + r * B));
  image.set(blocks, blocksOffset);
  return {
    image,
    bytes: image.byteLength,
    states: S,
    classes: C,
    rows: R,
    blocks: N,
    reachable: o.reachable,
    minTokens: o.minTokens,
  };
}
