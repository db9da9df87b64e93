/**
 * One GPU submission (a prefill chunk or K decode steps) and the readback of what it produced:
 * the ring rows of its steps, copied into a mappable buffer inside the same command buffer, so
 * the host maps once per submission, never per token.
 */
import type { Gpu } from "../../gpu/device.ts";
import { type Dispatch, encode } from "../../gpu/dispatch.ts";
import type { ReadbackPool } from "../../gpu/readback.ts";
import { checkValue } from "../../kernels/cross_check.ts";
import { RingView } from "../../kernels/step.ts";
import type { SlotBuffers, SlotLayout } from "./slots.ts";
import type { MonitorReadback } from "./monitor.ts";

/** What a submission reads about the sequence in a slot. */
export interface SlotOccupant {
  /** Ended on the host (stop string, cancel): its later tokens are dropped. */
  readonly finished: boolean;
  /** Alternatives to report with each token (0: none). */
  readonly topLogprobs: number;
}

/** The runner's buffers a submission encodes against and reads back from. */
export interface SubmissionContext {
  gpu: Gpu;
  layout: SlotLayout;
  slots: SlotBuffers;
  /** Mappable buffers the token ring and the top ring of one submission are copied into. */
  readback: { ring: ReadbackPool; top: ReadbackPool };
}

/** Options for {@linkcode Submission}. */
export interface SubmissionOptions<T extends SlotOccupant> {
  /** Ring region the steps write (see SlotLayout.ringOffset). */
  region: number;
  /** Steps that record tokens (0 for a prefill chunk that is not the last). */
  steps: number;
  /** The sequence in each batch slot when submitted. */
  slots: (T | undefined)[];
  /** Also read back the top-k alternatives (top_logprobs). */
  top: boolean;
  /** A prefill chunk (default: decode steps). */
  prefill?: boolean;
  /** Rows the prefill chunk runs as (its size class; see ForwardPass.prefillRows). */
  rows?: number;
  /** Prompt tokens the prefill chunk computes. */
  tokens?: number;
  /** Rows per slot of a verification pass (speculation); absent: one token per slot and step. */
  specRows?: number;
  /** Its first pass is cross-checked against the plain path (one plain step more). */
  checked?: boolean;
  /** The precision monitor's measurements to copy back too (its pass measured). */
  monitor?: MonitorReadback;
}

/** What one slot's speculative step did (kernels/speculate.wgsl `spec_end`). */
export interface SpecStep {
  /** Drafts proposed, the last `pooled` of them from the n-gram pool; drafts accepted. */
  drafted: number;
  pooled: number;
  accepted: number;
  /** Drafts the host's cap allowed within the pass's rows. */
  allowed: number;
  /** Rows per slot of the pass. */
  rows: number;
  /** The cross-check's relative distance (kernels/cross_check.wgsl), when it had one. */
  check?: number;
}

/**
 * A token as read back: which sequence, its id, logprob, alternatives and the fingerprint of the
 * hidden state that produced it (kernels/fingerprint.wgsl).
 */
export type TakeToken<T> = (
  seq: T,
  token: number,
  logprob: number,
  alts: { id: number; logprob: number }[] | undefined,
  fingerprint: number,
) => void;

/**
 * Encodes one command buffer, submits it when told to, and later reads back what it produced.
 *
 * Encoding and submitting are separate steps, and the readback is only requested on demand,
 * because of how Deno 2.9.6 maps buffers: `mapAsync` polls the device with `Maintain::wait`
 * inside the call, which blocks the calling thread until every submitted command buffer has
 * finished. Measured on the H200 (scripts/probe_map.ts): `mapAsync()` returned after 31 ms
 * behind a 31 ms job. So requesting a readback right after submitting (as this class once did)
 * left the GPU idle while the host encoded the next submission; the engine now encodes the next
 * one first, requests the readbacks, and submits it the moment the wait returns. The data is
 * taken as soon as the wait returns, not ≥ 10 ms later when the promise would resolve (see
 * gpu/readback.ts).
 */
export class Submission<T extends SlotOccupant> {
  /** Host time spent encoding and (once submitted) submitting this command buffer (ms). */
  hostMs: number;
  /** When it was submitted (`performance.now()`, ms; 0 before). */
  submittedAt = 0;
  /** Slots its steps advance: one past the last live one. */
  readonly width: number;
  /**
   * What its GPU time is measured by (engine pacing): `decode <width>` per step, or
   * `prefill <rows>` per chunk.
   */
  readonly work: string;
  readonly #staging: GPUBuffer;
  readonly #top?: GPUBuffer;
  readonly #mon?: GPUBuffer;
  #cb?: GPUCommandBuffer;
  #state: "encoded" | "submitted" | "discarded" = "encoded";
  #errors: Promise<GPUError | null>[] = [];
  #done?: Promise<void>;
  #ring?: ArrayBuffer;
  #topData?: ArrayBuffer;

  constructor(
    readonly ctx: SubmissionContext,
    dispatches: Iterable<Dispatch>,
    readonly o: SubmissionOptions<T>,
  ) {
    const { layout, slots, readback } = ctx, dev = ctx.gpu.device;
    const t0 = performance.now();
    this.width = o.slots.findLastIndex(Boolean) + 1;
    // A verification pass of R rows is `verifyR`, `checkR` with the plain path's cross-check.
    this.work = o.prefill
      ? `prefill ${o.rows}`
      : o.specRows
      ? `${o.checked ? "check" : "verify"}${o.specRows} ${this.width}`
      : `decode ${this.width}`;
    // Errors of this submission reject `done` (the engine then fails the requests it served)
    // instead of only being logged while garbage tokens stream on.
    dev.pushErrorScope("validation");
    dev.pushErrorScope("out-of-memory");
    const enc = dev.createCommandEncoder();
    const pass = enc.beginComputePass();
    encode(pass, dispatches);
    pass.end();
    this.#staging = readback.ring.take();
    if (o.steps) {
      const from = layout.ringByteOffset(o.region, 0), bytes = layout.ringBytes(o.steps);
      enc.copyBufferToBuffer(slots.step.ring, from, this.#staging, 0, bytes);
      // the fingerprint ring's rows of the same steps, right after (half the bytes per entry)
      enc.copyBufferToBuffer(
        slots.fpRing,
        layout.fingerprintBytes(o.region * layout.shape.maxSteps),
        this.#staging,
        bytes,
        layout.fingerprintBytes(o.steps),
      );
    }
    if (o.top && o.steps) {
      const stride = layout.topStride();
      this.#top = readback.top.take();
      const from = o.region * layout.shape.maxSteps * stride;
      enc.copyBufferToBuffer(slots.topRing, from, this.#top, 0, o.steps * stride);
    }
    if (o.monitor) {
      this.#mon = o.monitor.pool.take();
      enc.copyBufferToBuffer(o.monitor.src, 0, this.#mon, 0, o.monitor.bytes);
    }
    this.#cb = enc.finish();
    this.#scoped();
    this.hostMs = performance.now() - t0;
  }

  /** Pops the two error scopes pushed before a GPU call, keeping their results. */
  #scoped(): void {
    const dev = this.ctx.gpu.device;
    const oom = dev.popErrorScope(), invalid = dev.popErrorScope();
    this.#errors.push(invalid, oom);
  }

  /** Submits the encoded command buffer (once). */
  submit(): void {
    if (this.#state !== "encoded") {
      throw new Error(`internal error: a submission was submitted when ${this.#state}`);
    }
    const dev = this.ctx.gpu.device;
    const t0 = performance.now();
    dev.pushErrorScope("validation");
    dev.pushErrorScope("out-of-memory");
    dev.queue.submit([this.#cb!]);
    this.submittedAt = performance.now();
    this.#cb = undefined;
    this.#state = "submitted";
    this.#scoped();
    this.hostMs += performance.now() - t0;
  }

  /** Drops a submission that was never submitted (its command buffer is never run). */
  discard(): void {
    if (this.#state !== "encoded") {
      throw new Error(`internal error: a submission was discarded when ${this.#state}`);
    }
    this.#cb = undefined;
    this.#state = "discarded";
    this.ctx.readback.ring.give(this.#staging);
    if (this.#top) this.ctx.readback.top.give(this.#top);
    if (this.#mon) this.o.monitor!.pool.give(this.#mon);
  }

  /**
   * Resolves when what the submission recorded has been copied to the host; rejects with the
   * GPU's message when it rejected the submission. The first access requests the readback,
   * which blocks the calling thread until the GPU has finished all submitted work (see the
   * class doc).
   *
   * @throws Error ("internal error") when read before {@linkcode submit}.
   */
  get done(): Promise<void> {
    if (this.#state !== "submitted") {
      throw new Error(`internal error: a submission was read when ${this.#state}`);
    }
    if (!this.#done) {
      const { readback: { ring, top }, layout } = this.ctx;
      const steps = this.o.steps;
      this.#done = Promise.all([
        ...this.#errors,
        ring.read(this.#staging, layout.ringBytes(steps) + layout.fingerprintBytes(steps))
          .then((b) => (this.#ring = b)),
        this.#top && top.read(this.#top, steps * layout.topStride())
          .then((b) => (this.#topData = b)),
        this.#mon && this.o.monitor!.pool.read(this.#mon, this.o.monitor!.bytes),
      ]).then((r) => {
        const e = r.slice(0, this.#errors.length).find((x) => x) as GPUError | undefined;
        if (e) throw new Error(`internal error: the GPU rejected a submission: ${e.message}`);
        const mon = r.at(-1);
        if (this.#mon && mon instanceof ArrayBuffer) this.o.monitor!.take(mon);
      });
    }
    return this.#done;
  }

  /**
   * After `done`: hands every recorded token to `take`, in step order (a verification pass's
   * accepted tokens of a slot in row order), skipping sequences that finished meanwhile; a slot
   * the GPU had already stopped is reported through `stopped`, and a verification pass's drafts
   * through `spec`.
   */
  read(
    take: TakeToken<T>,
    stopped: (seq: T) => void,
    spec?: (seq: T, step: SpecStep) => void,
  ): void {
    const { layout } = this.ctx, R = this.o.specRows ?? 1;
    const ring = new RingView(this.#ring!, layout.ringBytes(this.o.steps));
    const raw = this.#topData;
    const topIds = raw && new Uint32Array(raw), topLps = raw && new Float32Array(raw);
    const alternatives = (seq: T, k: number, row: number) => {
      if (!topIds || !topLps || seq.topLogprobs <= 0) return undefined;
      const base = layout.topOffset(k, row);
      return Array.from({ length: seq.topLogprobs }, (_, i) => ({
        id: topIds[base + 2 * i],
        logprob: topLps[base + 2 * i + 1],
      }));
    };
    for (let k = 0; k < this.o.steps; k++) {
      this.o.slots.forEach((seq, s) => {
        if (!seq || seq.finished) return;
        const first = layout.ringEntry(k, s);
        if (ring.token(first) === undefined) return stopped(seq);
        for (let j = 0; j < R && !seq.finished; j++) {
          const token = ring.token(first + j);
          if (token === undefined) break;
          const alts = alternatives(seq, k, R > 1 ? s * R + j : s);
          take(seq, token, ring.logprob(first + j), alts, ring.fingerprint(first + j));
        }
        if (R > 1) {
          const [w, accepted] = ring.raw(first + R),
            check = checkValue(ring.fingerprint(first + R));
          spec?.(seq, {
            drafted: w & 0xff,
            pooled: (w >>> 8) & 0xff,
            allowed: (w >>> 16) & 0xff,
            accepted,
            rows: R,
            ...(check === undefined ? {} : { check }),
          });
        }
      });
    }
  }
}
