/**
 * One GPU submission (a prefill chunk or K decode steps) and the readback of what it produced:
 * the ring rows of its steps, copied into a mappable buffer inside the same command buffer, so
 * the host maps once per submission, never per token.
 */
import type { Decoder } from "./forward.ts";
import type { Sequence } from "../sched/sequence.ts";
import { type Dispatch, encode } from "../../gpu/dispatch.ts";

/** The ring's marker for "this slot was already finished at this step". */
const NO_TOKEN = 0xffffffff;

/** Options for {@linkcode Submission}. */
export interface SubmissionOptions {
  /** Ring region the steps write (see Decoder.ringOffset). */
  region: number;
  /** Steps that record tokens (0 for a prefill chunk that is not the last). */
  steps: number;
  /** The sequence in each batch slot when submitted. */
  slots: (Sequence | undefined)[];
  /** Also read back the top-k alternatives (top_logprobs). */
  top: boolean;
  /** A prefill chunk (default: decode steps). */
  prefill?: boolean;
  /** Rows the prefill chunk runs as (its size class; see Decoder.prefillRows). */
  rows?: number;
  /** Prompt tokens the prefill chunk computes. */
  tokens?: number;
}

/** A token as read back: which sequence, its id, logprob and alternatives. */
export type TakeToken = (
  seq: Sequence,
  token: number,
  logprob: number,
  alts?: { id: number; logprob: number }[],
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
export class Submission {
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
  #cb?: GPUCommandBuffer;
  #state: "encoded" | "submitted" | "discarded" = "encoded";
  #errors: Promise<GPUError | null>[] = [];
  #done?: Promise<void>;
  #ring?: ArrayBuffer;
  #topData?: ArrayBuffer;

  constructor(
    readonly decoder: Decoder,
    dispatches: Iterable<Dispatch>,
    readonly o: SubmissionOptions,
  ) {
    const d = decoder, dev = d.gpu.device, S = d.opts.maxSlots;
    const t0 = performance.now();
    this.width = o.slots.findLastIndex(Boolean) + 1;
    this.work = o.prefill ? `prefill ${o.rows}` : `decode ${this.width}`;
    // Errors of this submission reject `done` (the engine then fails the requests it served)
    // instead of only being logged while garbage tokens stream on.
    dev.pushErrorScope("validation");
    dev.pushErrorScope("out-of-memory");
    const enc = dev.createCommandEncoder();
    const pass = enc.beginComputePass();
    encode(pass, dispatches);
    pass.end();
    this.#staging = d.readback.ring.take();
    if (o.steps) {
      const bytes = o.steps * S * 8;
      enc.copyBufferToBuffer(d.step.ring, d.ringOffset(o.region, 0) * 8, this.#staging, 0, bytes);
    }
    if (o.top && o.steps) {
      const stride = d.topStride();
      this.#top = d.readback.top.take();
      const from = o.region * d.opts.maxSteps * stride;
      enc.copyBufferToBuffer(d.topRing, from, this.#top, 0, o.steps * stride);
    }
    this.#cb = enc.finish();
    this.#scoped();
    this.hostMs = performance.now() - t0;
  }

  /** Pops the two error scopes pushed before a GPU call, keeping their results. */
  #scoped(): void {
    const dev = this.decoder.gpu.device;
    const oom = dev.popErrorScope(), invalid = dev.popErrorScope();
    this.#errors.push(invalid, oom);
  }

  /** Submits the encoded command buffer (once). */
  submit(): void {
    if (this.#state !== "encoded") {
      throw new Error(`internal error: a submission was submitted when ${this.#state}`);
    }
    const dev = this.decoder.gpu.device;
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
    this.decoder.readback.ring.give(this.#staging);
    if (this.#top) this.decoder.readback.top.give(this.#top);
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
      const { ring, top } = this.decoder.readback, S = this.decoder.opts.maxSlots;
      const steps = this.o.steps;
      this.#done = Promise.all([
        ...this.#errors,
        ring.read(this.#staging, steps * S * 8).then((b) => (this.#ring = b)),
        this.#top && top.read(this.#top, steps * this.decoder.topStride())
          .then((b) => (this.#topData = b)),
      ]).then((r) => {
        const e = r.slice(0, this.#errors.length).find((x) => x) as GPUError | undefined;
        if (e) throw new Error(`internal error: the GPU rejected a submission: ${e.message}`);
      });
    }
    return this.#done;
  }

  /**
   * After `done`: hands every recorded token to `take`, in step order, skipping sequences that
   * finished meanwhile; a slot the GPU had already stopped is reported through `stopped`.
   */
  read(take: TakeToken, stopped: (seq: Sequence) => void): void {
    const S = this.decoder.opts.maxSlots, K = this.decoder.opts.topK;
    const ring = new Uint32Array(this.#ring!);
    const ringF = new Float32Array(ring.buffer);
    const raw = this.#topData;
    const topIds = raw && new Uint32Array(raw), topLps = raw && new Float32Array(raw);
    const stride = this.decoder.topStride() / 4;
    for (let k = 0; k < this.o.steps; k++) {
      this.o.slots.forEach((seq, s) => {
        if (!seq || seq.finished) return;
        const i = (k * S + s) * 2;
        if (ring[i] === NO_TOKEN) return stopped(seq);
        let alts: { id: number; logprob: number }[] | undefined;
        if (topIds && topLps && seq.sampling.topLogprobs > 0) {
          const base = k * stride + s * K * 2;
          alts = Array.from({ length: seq.sampling.topLogprobs }, (_, j) => ({
            id: topIds[base + 2 * j],
            logprob: topLps[base + 2 * j + 1],
          }));
        }
        take(seq, ring[i], ringF[i + 1], alts);
      });
    }
  }
}
