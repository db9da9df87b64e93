/**
 * The batch's constraint state on the GPU, owned by the runner: the packed grammar table images
 * (an arena whose images are shared by every slot running the same spec), each slot's grammar
 * state, the logit_bias rows, and the model's token-bytes image (docs/grammar.md). The runner
 * writes a slot's share at admission; the forward pass binds the buffers into the sampler
 * (kernels/grammar_mask.wgsl) and the constraint kernels (kernels/constraint.wgsl).
 */
import { createStorage, type Gpu, writeBuffer } from "../../gpu/device.ts";
import { BIAS_ENTRY_BYTES, MAX_LOGIT_BIAS, packBias } from "../../kernels/constraint.ts";
import { NO_GRAMMAR } from "../../kernels/sample.ts";

/** A compiled grammar's table image, named by the spec it was compiled from. */
export interface GrammarImage {
  key: string;
  image: Uint32Array;
}

/** What a slot's sampler parameters say of its constraints (kernels/sample.ts). */
export interface SlotConstraintWords {
  /** First word of its tables in the arena, or NO_GRAMMAR. */
  grammar: number;
  /** Its logit_bias entries. */
  nBias: number;
}

interface Placed {
  offset: number; // words
  words: number;
  refs: number;
  used: number; // admission counter at last use (LRU among unreferenced images)
}

const INITIAL_ARENA_WORDS = 1 << 18; // 1 MiB

/**
 * A grammar's tables do not fit the device's largest binding next to the others in use: the
 * request is answered 429 (the `queue_full` code, api/errors.ts), to retry when fewer run.
 */
export class ArenaFullError extends Error {
  readonly code = "queue_full";
  readonly retryAfterSeconds = 1;
}

/** See the module doc. */
export class SlotConstraints {
  /** Bumped whenever a buffer below is replaced: dispatches that bind them must be rebuilt. */
  version = 0;
  #tables?: GPUBuffer;
  #arenaWords = 0;
  #state?: GPUBuffer;
  #bias?: GPUBuffer;
  #tokenBytes?: GPUBuffer;
  readonly #placed = new Map<string, Placed>();
  readonly #slotKey: (string | undefined)[];
  readonly #slotBias: boolean[];
  #admissions = 0;

  constructor(readonly gpu: Gpu, readonly maxSlots: number) {
    this.#slotKey = new Array(maxSlots).fill(undefined);
    this.#slotBias = new Array(maxSlots).fill(false);
  }

  /** Whether some slot of `live` (by slot: occupied or not) is constrained, or biased. */
  flags(live: readonly unknown[]): { grammar: boolean; bias: boolean } {
    let grammar = false, bias = false;
    live.forEach((s, i) => {
      if (!s) return;
      grammar ||= this.#slotKey[i] !== undefined;
      bias ||= this.#slotBias[i];
    });
    return { grammar, bias };
  }

  /** Whether `slot`'s occupant is constrained by a grammar. */
  constrained(slot: number): boolean {
    return this.#slotKey[slot] !== undefined;
  }

  /** The buffers the grammar kernels bind (they exist once a grammar was admitted). */
  get buffers(): { tables: GPUBuffer; state: GPUBuffer; tokenBytes: GPUBuffer } {
    if (!this.#tables || !this.#state || !this.#tokenBytes) {
      throw new Error("internal error: grammar buffers bound before any grammar was admitted");
    }
    return { tables: this.#tables, state: this.#state, tokenBytes: this.#tokenBytes };
  }

  /** The logit_bias buffer ([slots, MAX_LOGIT_BIAS] entries), created on first use. */
  get bias(): GPUBuffer {
    if (!this.#bias) {
      this.#bias = createStorage(
        this.gpu,
        this.maxSlots * MAX_LOGIT_BIAS * BIAS_ENTRY_BYTES,
        undefined,
        "logit_bias",
      );
      this.version++;
    }
    return this.#bias;
  }

  /**
   * Takes `slot` for a new occupant: drops the previous one's share, places its grammar's tables
   * (once per key; unreferenced images are evicted least recently used first, the arena grows up
   * to the largest binding) and writes its start state and logit_bias row. Queue-ordered, like
   * the rest of an admission: work already submitted still sees what it was built with.
   *
   * @param o.tokenBytes the model's token-bytes image, asked for with the first grammar
   * @throws ArenaFullError when the tables cannot be placed
   */
  admit(
    slot: number,
    o: {
      grammar?: GrammarImage;
      bias?: readonly (readonly [number, number])[];
      tokenBytes?: () => Uint32Array;
    },
  ): SlotConstraintWords {
    this.release(slot);
    const q = this.gpu.device.queue;
    let grammar = NO_GRAMMAR;
    if (o.grammar) {
      if (!this.#tokenBytes) {
        if (!o.tokenBytes) throw new Error("internal error: a grammar without token bytes");
        const img = o.tokenBytes();
        this.#tokenBytes = createStorage(this.gpu, img.byteLength, img, "token_bytes");
        this.#state = createStorage(this.gpu, this.maxSlots * 4, undefined, "grammar_state");
        this.version++;
      }
      const p = this.#place(o.grammar);
      p.refs++;
      p.used = ++this.#admissions;
      this.#slotKey[slot] = o.grammar.key;
      grammar = p.offset;
      q.writeBuffer(this.#state!, slot * 4, Uint32Array.of(o.grammar.image[14]));
    }
    const n = o.bias?.length ?? 0;
    if (n > 0) {
      q.writeBuffer(this.bias, slot * MAX_LOGIT_BIAS * BIAS_ENTRY_BYTES, packBias(o.bias!));
      this.#slotBias[slot] = true;
    }
    return { grammar, nBias: n };
  }

  /** Drops `slot`'s share (its occupant ended); its image stays placed until space is needed. */
  release(slot: number): void {
    const key = this.#slotKey[slot];
    if (key !== undefined) {
      const p = this.#placed.get(key);
      if (p) p.refs--;
    }
    this.#slotKey[slot] = undefined;
    this.#slotBias[slot] = false;
  }

  /** Images placed, and the arena's size in words (tests, diagnostics). */
  get stats(): { images: number; arenaWords: number } {
    return { images: this.#placed.size, arenaWords: this.#arenaWords };
  }

  #place(g: GrammarImage): Placed {
    const hit = this.#placed.get(g.key);
    if (hit) return hit;
    const words = g.image.length;
    let offset = this.#gap(words);
    while (offset === undefined && this.#evictOne()) offset = this.#gap(words);
    if (offset === undefined) {
      this.#grow(words);
      offset = this.#gap(words)!;
    }
    writeBuffer(this.gpu, this.#tables!, offset * 4, g.image);
    const p = { offset, words, refs: 0, used: 0 };
    this.#placed.set(g.key, p);
    return p;
  }

  /** The lowest word offset with `words` free words, if any. */
  #gap(words: number): number | undefined {
    if (!this.#tables) return undefined;
    const taken = [...this.#placed.values()].sort((a, b) => a.offset - b.offset);
    let at = 0;
    for (const p of taken) {
      if (p.offset - at >= words) return at;
      at = Math.max(at, p.offset + p.words);
    }
    return this.#arenaWords - at >= words ? at : undefined;
  }

  /** Evicts the least recently used image no slot references; false when there is none. */
  #evictOne(): boolean {
    let victim: string | undefined, oldest = Infinity;
    for (const [k, p] of this.#placed) {
      if (p.refs === 0 && p.used < oldest) [victim, oldest] = [k, p.used];
    }
    if (victim === undefined) return false;
    this.#placed.delete(victim);
    return true;
  }

  /** A larger arena holding everything placed at the same offsets, with room for `words` more. */
  #grow(words: number): void {
    const used = Math.max(0, ...[...this.#placed.values()].map((p) => p.offset + p.words));
    const limit = Math.floor(this.gpu.maxBinding / 4);
    let size = Math.max(this.#arenaWords, INITIAL_ARENA_WORDS);
    while (size < used + words && size < limit) size = Math.min(limit, size * 2);
    if (size < used + words) {
      throw new ArenaFullError(
        `constraint tables of ${words * 4} bytes do not fit next to the ${this.#placed.size} ` +
          `grammars in use (the device binds at most ${this.gpu.maxBinding} bytes); retry when ` +
          "fewer constrained requests run, or simplify the schema",
      );
    }
    const next = createStorage(this.gpu, size * 4, undefined, "grammar_tables");
    if (this.#tables) {
      const enc = this.gpu.device.createCommandEncoder();
      enc.copyBufferToBuffer(this.#tables, 0, next, 0, this.#arenaWords * 4);
      this.gpu.device.queue.submit([enc.finish()]);
      const old = this.#tables;
      // In-flight work may still bind the old arena: destroy it once the queue has passed it.
      this.gpu.device.queue.onSubmittedWorkDone().then(() => old.destroy());
    }
    this.#tables = next;
    this.#arenaWords = size;
    this.version++;
  }
}
