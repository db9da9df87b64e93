/**
 * The model runner: the only owner of the batch's per-slot GPU state (engine/runner/slots.ts).
 * It admits a sequence into a slot (block table, sampling parameters, penalty counts, state),
 * stops a slot, and turns a slot's prompt or the whole batch's next steps into submissions
 * (engine/runner/submission.ts) whose readbacks hand tokens back by slot. The forward pass
 * (engine/runner/forward.ts) builds the dispatches of that work over these buffers.
 */
import type { SamplingOptions } from "../../api/types.ts";
import type { Gpu } from "../../gpu/device.ts";
import type { AttentionMask } from "../../kernels/attention_mask.ts";
import { type Dispatch, encode } from "../../gpu/dispatch.ts";
import { ReadbackPool } from "../../gpu/readback.ts";
import { packSampleParams, SAMPLE_PARAMS_BYTES, SEEN_BIT } from "../../kernels/sample.ts";
import { POOL_WORDS } from "../../kernels/speculate.ts";
import { DONE, SLOT_STATE_BYTES, slotStateWords } from "../../kernels/step.ts";
import type { ModelConfig } from "../model/config.ts";
import type { ModelWeights } from "../model/weights.ts";
import type { KvPool } from "../kv/pool.ts";
import { type GrammarImage, SlotConstraints } from "./constraints.ts";
import { ForwardPass } from "./forward.ts";
import { PrecisionMonitor } from "./monitor.ts";
import { createSlotBuffers, type SlotBuffers, SlotLayout, type SlotShape } from "./slots.ts";
import {
  type SlotOccupant,
  Submission,
  type SubmissionContext,
  type SubmissionOptions,
} from "./submission.ts";

const READ = GPUBufferUsage.MAP_READ | GPUBufferUsage.COPY_DST;

/** Sizes fixed when the runner is created. */
export interface RunnerOptions extends SlotShape {
  /** Tokens per prefill chunk. */
  maxChunk: number;
  /** The attention mask compiled into the attention kernels (default causal). */
  mask?: AttentionMask;
  /** Verification passes also draft from the n-gram pool of guesses (default true). */
  draftPool?: boolean;
}

/** What a slot needs to know of the sequence admitted into it. */
export interface SlotAdmission {
  /** Physical blocks of its KV, in order (at most the table's width). */
  table: readonly number[];
  /** Its tokens so far (the prompt): they count as seen for the repetition penalty. */
  tokens: readonly number[];
  sampling: SamplingOptions;
  /** The Philox key's u64 seed. */
  seed: bigint;
  /** Most drafts per verification step (0: this sequence does not speculate). */
  specCap?: number;
  /** The grammar its output must match (docs/grammar.md): its tables, named by their spec. */
  grammar?: GrammarImage;
}

/** A decode submission's verification passes: rows per slot, and whether to cross-check. */
export interface SpeculateStep {
  /** R: rows per slot (drafts + 1), 2..the runner's rows. */
  rows: number;
  /** The first pass also runs the plain path and compares (engine/runner/verify.ts). */
  check?: boolean;
}

/** The batch on the GPU: per-slot state, and the work that advances it. */
export class Runner<T extends SlotOccupant> {
  readonly layout: SlotLayout;
  /** Dispatch builders over the weights, the KV pool and the slot buffers. */
  readonly forward: ForwardPass;
  /** Which weights each layer runs and what decides it (engine/runner/monitor.ts). */
  readonly monitor: PrecisionMonitor;
  readonly #slots: SlotBuffers;
  /** Grammar tables and states, logit_bias rows (engine/runner/constraints.ts). */
  readonly constraints: SlotConstraints;
  readonly #tokenBytes?: () => Uint32Array;
  readonly #ctx: SubmissionContext;
  /** Each slot's draft cap as last written (-1: unknown). */
  readonly #caps: Int32Array;
  #region = 0;

  /**
   * @param o.tokenBytes the model's token-bytes image (engine/grammar/vocab.ts tokenBytesImage),
   *   asked for when the first constrained sequence is admitted
   */
  constructor(
    readonly gpu: Gpu,
    readonly cfg: ModelConfig,
    weights: ModelWeights,
    o: {
      kv: KvPool;
      options: RunnerOptions;
      eosIds: number[];
      tokenBytes?: () => Uint32Array;
    },
  ) {
    const opts = o.options;
    this.layout = new SlotLayout(opts);
    this.#caps = new Int32Array(opts.maxSlots).fill(-1);
    this.#slots = createSlotBuffers(gpu, this.layout, { vocab: cfg.vocabSize, eosIds: o.eosIds });
    this.constraints = new SlotConstraints(gpu, opts.maxSlots);
    this.#tokenBytes = o.tokenBytes;
    this.monitor = new PrecisionMonitor(gpu, weights);
    this.forward = new ForwardPass(gpu, cfg, weights, {
      monitor: this.monitor,
      kv: o.kv,
      slots: this.#slots,
      layout: this.layout,
      maxChunk: opts.maxChunk,
      mask: opts.mask,
      draftPool: opts.draftPool,
      constraints: this.constraints,
    });
    const readback = {
      // a submission's token ring rows, then its fingerprint rows
      ring: new ReadbackPool(
        gpu.device,
        this.layout.ringBytes(opts.maxSteps) + this.layout.fingerprintBytes(opts.maxSteps),
        8,
      ),
      top: new ReadbackPool(gpu.device, opts.maxSteps * this.layout.topStride(), 2),
    };
    this.#ctx = { gpu, layout: this.layout, slots: this.#slots, readback };
  }

  /** The mappable buffers submissions read back through (tests wait for them to be primed). */
  get readback(): SubmissionContext["readback"] {
    return this.#ctx.readback;
  }

  /**
   * Writes the state of a sequence taking `slot`: its block table (the last column stays the
   * trash block), penalty counts, sampling parameters, grammar and logit_bias, token budget and
   * length. Queue-ordered: work submitted before still sees the slot's previous state.
   *
   * @throws ArenaFullError (engine/runner/constraints.ts) when its grammar's tables cannot be
   *   placed; nothing of the slot is written then
   */
  admit(slot: number, a: SlotAdmission): void {
    const q = this.gpu.device.queue, V = this.cfg.vocabSize, { maxBlocks } = this.layout;
    const words = this.constraints.admit(slot, {
      grammar: a.grammar,
      bias: a.sampling.logitBias,
      tokenBytes: this.#tokenBytes,
    });
    const table = new Uint32Array(maxBlocks);
    table.set(a.table.slice(0, maxBlocks - 1));
    q.writeBuffer(this.#slots.blockTable, slot * maxBlocks * 4, table);
    const counts = new Uint32Array(V);
    for (const t of a.tokens) counts[t] = SEEN_BIT;
    q.writeBuffer(this.#slots.step.counts, slot * V * 4, counts);
    q.writeBuffer(
      this.#slots.params,
      slot * SAMPLE_PARAMS_BYTES,
      packSampleParams({ ...a.sampling, seed: a.seed, ...words }),
    );
    const sp = this.#slots.spec;
    const state = {
      done: false,
      remaining: a.sampling.maxTokens,
      stopAtEos: a.sampling.stopAtEos !== false,
    };
    q.writeBuffer(this.#slots.step.slotState, slot * SLOT_STATE_BYTES, slotStateWords(state));
    q.writeBuffer(this.#slots.step.seqLen, slot * 4, Uint32Array.of(a.tokens.length));
    if (sp) {
      // Its history so far: drafts come from it (step_end and spec_end append what follows).
      const H = this.layout.shape.contextLength;
      q.writeBuffer(sp.hist, slot * H * 4, Uint32Array.from(a.tokens.slice(0, H)));
      q.writeBuffer(sp.pool, slot * POOL_WORDS * 4, new Uint32Array(POOL_WORDS)); // no guesses yet
      this.setSpecCap(slot, a.specCap ?? 0);
    }
  }

  /**
   * Points logical blocks of the sequence in `slot` at new physical blocks (`moved`: re-encoded
   * behind the hot window, engine/runner/reencode.ts). Queue-ordered: work submitted before reads
   * the old blocks, work submitted after the new ones.
   */
  repoint(slot: number, moved: readonly { index: number; to: number }[]): void {
    const q = this.gpu.device.queue, { maxBlocks } = this.layout;
    for (const m of moved) {
      if (m.index >= maxBlocks - 1) continue; // past the table: the last column stays the trash
      q.writeBuffer(this.#slots.blockTable, (slot * maxBlocks + m.index) * 4, Uint32Array.of(m.to));
    }
  }

  /**
   * Sets how many drafts `slot` may take per verification step (0: none), from the next
   * submission on (queue order); a cap already set is not written again.
   */
  setSpecCap(slot: number, cap: number): void {
    const sp = this.#slots.spec;
    if (!sp || this.#caps[slot] === cap) return;
    this.#caps[slot] = cap;
    this.gpu.device.queue.writeBuffer(sp.cap, slot * 4, Uint32Array.of(cap));
  }

  /** Rows per slot of a verification pass (1: this runner never speculates). */
  get specRows(): number {
    return this.layout.rows;
  }

  /**
   * Stops `slot` on the GPU: later steps write its KV to the trash block and record no token.
   * Safe while submissions that use it are in flight (queue order).
   */
  stop(slot: number): void {
    const q = this.gpu.device.queue;
    this.constraints.release(slot);
    q.writeBuffer(this.#slots.step.slotState, slot * SLOT_STATE_BYTES, slotStateWords(DONE));
  }

  /** Rows a prefill chunk of `count` tokens runs as (see ForwardPass.prefillRows). */
  prefillRows(count: number): number {
    return this.forward.prefillRows(count);
  }

  /**
   * Prefills `ids[from..]` of the sequence admitted into `slot`, in chunks of at most maxChunk
   * tokens; the last chunk samples its first token into the ring. Each chunk's inputs are
   * written to the queue and then its submission is handed to `commit`, which must submit it
   * before this returns to write the next chunk's (queue order keeps chunks apart).
   */
  prefill(
    slot: number,
    ids: readonly number[],
    o: { from: number; occupant: T; withTop: boolean },
    commit: (sub: Submission<T>) => void,
  ): void {
    const f = this.forward, chunk = f.maxChunk;
    for (let p = o.from; p < ids.length; p += chunk) {
      const part = ids.slice(p, Math.min(p + chunk, ids.length));
      const last = p + part.length === ids.length;
      f.writePrefill(part, slot, p);
      const region = this.#nextRegion();
      const slots = new Array<T | undefined>(this.layout.shape.maxSlots).fill(undefined);
      slots[slot] = o.occupant;
      const dispatches = f.prefill(part.length, {
        slot,
        pos0: p,
        last,
        region,
        withTop: o.withTop,
        ...this.constraints.flags(slots),
      });
      commit(
        new Submission(this.#ctx, dispatches, {
          region,
          steps: last ? 1 : 0,
          slots,
          top: o.withTop,
          prefill: true,
          rows: f.prefillRows(part.length),
          tokens: part.length,
          monitor: this.monitor.readback(),
        }),
      );
    }
  }

  /**
   * Encodes `steps` decode steps of every slot up to the last live one (not submitted), plain or
   * (`speculate`, when the runner has verification rows) verification passes of its rows, the
   * first one cross-checked against the plain path when it says so. `live` holds, by slot, the
   * sequences still running: they receive their tokens when it is read. `keys`: the most keys a
   * slot holds by the last step (picks decode attention's length bucket; default the context
   * length, right for any).
   */
  decode(
    live: (T | undefined)[],
    steps: number,
    o: { withTop: boolean; speculate?: SpeculateStep; keys?: number },
  ): Submission<T> {
    const region = this.#nextRegion(), width = live.findLastIndex(Boolean) + 1;
    const R = o.speculate?.rows ?? 1, f = this.forward;
    const flags = { withTop: o.withTop, ...this.constraints.flags(live) };
    const dispatches: Dispatch[] = [];
    for (let k = 0; k < steps; k++) {
      const check = k === 0 && (o.speculate?.check ?? false);
      dispatches.push(
        ...(R > 1
          ? f.verifyStep(width, R, { region, k, check }, flags, o.keys)
          : f.decodeStep(width, region, k, flags, o.keys)),
      );
    }
    return new Submission(this.#ctx, dispatches, {
      region,
      steps,
      slots: live,
      top: o.withTop,
      ...(R > 1 ? { specRows: R, checked: o.speculate?.check ?? false } : {}),
      // step 0 of a plain submission measures (verification passes do not)
      monitor: steps > 0 && R === 1 ? this.monitor.readback() : undefined,
    });
  }

  /** A submission of arbitrary dispatches over this runner's buffers (tests, profiling). */
  submission(dispatches: Iterable<Dispatch>, o: SubmissionOptions<T>): Submission<T> {
    return new Submission(this.#ctx, dispatches, o);
  }

  /**
   * The dispatches of one decode step of slots [0, slots) with every slot's length set to
   * `context`, for timing (scripts/bench_profile.ts). Run it only while nothing runs: with every
   * slot done, the step writes KV to the trash block and records no token.
   */
  profileDecodeStep(slots: number, context: number, k = 0): Dispatch[] {
    const q = this.gpu.device.queue;
    q.writeBuffer(this.#slots.step.seqLen, 0, new Uint32Array(slots).fill(context));
    return this.forward.decodeStep(slots, 0, k, { withTop: false }, context);
  }

  /**
   * The dispatches of one verification pass of `rows` rows per slot (default the runner's) over
   * slots [0, slots) with every row live, for timing: each slot running at `context` keys with a
   * history that repeats, so it drafts its full depth. Only while nothing runs;
   * {@linkcode profileDone} puts the slots back to done.
   *
   * @throws Error when the runner has no verification rows
   */
  profileVerifyStep(slots: number, context: number, k = 0, rows = this.layout.rows): Dispatch[] {
    const sp = this.#slots.spec, R = rows, H = this.layout.shape.contextLength;
    if (!(R >= 2 && R <= this.layout.rows)) throw new Error(`verify profile: rows ${R}`);
    if (!sp) throw new Error("this engine was built without speculation (--speculate off)");
    const q = this.gpu.device.queue;
    const state = slotStateWords({ done: false, remaining: 1e6, stopAtEos: false });
    for (let s = 0; s < slots; s++) {
      q.writeBuffer(this.#slots.step.slotState, s * SLOT_STATE_BYTES, state);
      q.writeBuffer(sp.hist, s * H * 4, Uint32Array.from({ length: H }, (_, i) => 1 + (i % 9)));
      this.setSpecCap(s, R - 1);
    }
    q.writeBuffer(this.#slots.step.seqLen, 0, new Uint32Array(slots).fill(context));
    return this.forward.verifyStep(slots, rows, { region: 0, k }, { withTop: false }, context);
  }

  /** Puts slots [0, slots) back to done after profiling. */
  profileDone(slots: number): void {
    for (let s = 0; s < slots; s++) this.stop(s);
  }

  /**
   * The dispatches of one prefill chunk of `tokens` tokens at position 0 of slot 0 (inputs
   * written), for timing. Slot 0's block table is pointed at the trash block first, so the
   * chunk's KV writes land where no request reads (the next admission rewrites the table): run
   * it only while nothing runs.
   *
   * @throws Error when `tokens` is not within 1..maxChunk
   */
  profilePrefill(tokens: number): Dispatch[] {
    const f = this.forward;
    if (!(tokens >= 1 && tokens <= f.maxChunk)) {
      throw new Error(`prefill profile: tokens must be 1..${f.maxChunk}; got ${tokens}`);
    }
    const q = this.gpu.device.queue;
    q.writeBuffer(this.#slots.blockTable, 0, new Uint32Array(this.layout.maxBlocks));
    const ids = Array.from({ length: tokens }, (_, i) => (i * 7919) % this.cfg.vocabSize);
    f.writePrefill(ids, 0, 0);
    return f.prefill(tokens, { slot: 0, pos0: 0, last: false, region: 0, withTop: false });
  }

  /**
   * Log-probabilities of `ids[1..]`, each given the tokens before it (teacher forcing), computed
   * in scoring chunks into slot 0 with KV blocks `table` (at least `ids.length` tokens' worth).
   * Only while nothing runs: slot 0's block table is overwritten. `o.chunk` caps the tokens per
   * chunk, and `o.afterChunk(written)` runs after each chunk with the positions whose KV is
   * written (an engine with a KV codec re-encodes the blocks behind the hot window there, so
   * later chunks read them as decoding would).
   *
   * @returns `ids.length − 1` natural-log probabilities (f32 logits, log-softmax in f64)
   */
  async score(
    ids: readonly number[],
    table: readonly number[],
    o: { chunk?: number; afterChunk?: (written: number) => void } = {},
  ): Promise<Float64Array> {
    const f = this.forward, dev = this.gpu.device, V = this.cfg.vocabSize;
    const { maxBlocks } = this.layout;
    const row = new Uint32Array(maxBlocks);
    row.set(table.slice(0, maxBlocks - 1));
    dev.queue.writeBuffer(this.#slots.blockTable, 0, row);
    const out = new Float64Array(Math.max(0, ids.length - 1));
    const T = Math.min(f.scoreChunk(), o.chunk ?? Infinity);
    for (let p = 0; p < ids.length - 1; p += T) {
      const part = ids.slice(p, Math.min(p + T, ids.length));
      f.writePrefill(part, 0, p);
      const { dispatches, logits, stats } = f.score(part.length);
      const n = Math.min(part.length, ids.length - 1 - p); // rows with a next token
      const picked = dev.createBuffer({ size: n * 4, usage: READ });
      const lse = dev.createBuffer({ size: n * 16, usage: READ });
      const enc = dev.createCommandEncoder();
      const pass = enc.beginComputePass();
      encode(pass, dispatches);
      pass.end();
      for (let r = 0; r < n; r++) {
        enc.copyBufferToBuffer(logits, (r * V + ids[p + r + 1]) * 4, picked, r * 4, 4);
      }
      enc.copyBufferToBuffer(stats, 0, lse, 0, n * 16);
      dev.queue.submit([enc.finish()]);
      await Promise.all([picked.mapAsync(GPUMapMode.READ), lse.mapAsync(GPUMapMode.READ)]);
      const x = new Float32Array(picked.getMappedRange()),
        st = new Float32Array(lse.getMappedRange());
      for (let r = 0; r < n; r++) out[p + r] = x[r] - st[4 * r + 1];
      picked.destroy();
      lse.destroy();
      o.afterChunk?.(p + part.length);
    }
    return out;
  }

  #nextRegion(): number {
    return (this.#region = (this.#region + 1) % this.layout.shape.regions);
  }
}
