/**
 * The forward pass as GPU dispatches (llama2.c's `forward()`, one line per kernel). `ForwardPass`
 * owns the weights and the scratch buffers and builds two kinds of work over the runner's slot
 * buffers (engine/runner/slots.ts) and the KV pool (engine/kv/pool.ts): a prefill of one
 * sequence's new tokens, and a decode step that advances every running slot by one token
 * entirely on the GPU (embedding reads the token the previous step sampled). Both end with
 * sampling and `step_end`, which records tokens in the ring. Built dispatches are memoised per
 * shape: the hot loop only encodes them.
 */
import type { Gpu } from "../../gpu/device.ts";
import { createStorage } from "../../gpu/device.ts";
import type { Dispatch } from "../../gpu/dispatch.ts";
import { attentionScale, type ModelConfig } from "../model/config.ts";
import type { ModelWeights } from "../model/weights.ts";
import type { KvPool } from "../kv/pool.ts";
import type { SlotBuffers, SlotLayout } from "./slots.ts";
import { embeddingDispatch } from "../../kernels/embedding.ts";
import { rmsnormDispatch } from "../../kernels/rmsnorm.ts";
import { matmulDispatches } from "../../kernels/matmul.ts";
import { ropeKvDispatch } from "../../kernels/rope_kv.ts";
import { attentionDispatch, chunkWords } from "../../kernels/attention.ts";
import { attentionDecodeDispatches, warmDecodeBuckets } from "../../kernels/attention_decode.ts";
import {
  attendedKeys,
  type AttentionMask,
  bucketFor,
  CAUSAL,
  lengthBuckets,
} from "../../kernels/attention_mask.ts";
import { logitsStatsDispatch } from "../../kernels/logits.ts";
import { stepDispatch } from "../../kernels/step.ts";
import type { SlotConstraints } from "./constraints.ts";
import type { LiveRows, PrecisionMonitor } from "./monitor.ts";
import { lmHeadDispatches, memo, StepTail, type TailFlags } from "./step_tail.ts";
import { VerifyPlans } from "./verify.ts";

/** Weights and scratch, and builders for the dispatches of a prefill chunk and a decode step. */
export class ForwardPass {
  /** Tokens per prefill chunk at most. */
  readonly maxChunk: number;
  readonly #slots: SlotBuffers;
  readonly #layout: SlotLayout;
  readonly #kv: KvPool;
  // Scratch, all f32 unless noted; T = maxChunk rows, S = slots.
  readonly #x: GPUBuffer; // [T, H] residual stream
  readonly #qkv: GPUBuffer; // [T, (Hq + 2 Hkv) D]
  readonly #q: GPUBuffer; // [T, Hq, D] rotated queries (prefill; decode rotates on load)
  readonly #attn: GPUBuffer; // [T, Hq, D]
  readonly #act: GPUBuffer; // [T, F]
  readonly #last: GPUBuffer; // [S, H] normed rows that get logits
  readonly #logits: GPUBuffer; // [S, V]
  readonly #stats: GPUBuffer; // vec4 [S]
  readonly #prefillTok: GPUBuffer; // u32 [T]
  readonly #prefillPos: GPUBuffer; // u32 [T]
  readonly #prefillSeq: GPUBuffer; // u32 [T]
  readonly #lastRow: GPUBuffer; // u32 [1]
  readonly #prefillChunk: GPUBuffer; // u32 [slot, pos0, tokens, 0] of the prefill chunk
  /** The attention mask compiled into the attention kernels. */
  readonly mask: AttentionMask;
  /** Decode attention's length buckets (tops, in keys attended; kernels/attention_mask.ts). */
  readonly buckets: number[];
  #decodePlans = new Map<string, Dispatch[]>();
  /** Decode steps that measure for the precision monitor (the first of a submission). */
  #monitoredPlans = new Map<string, Dispatch[]>();
  /** Verification passes (speculative decoding). */
  readonly #verify: VerifyPlans;
  readonly #monitor?: PrecisionMonitor;
  /** The monitor's version the built plans follow (its precision switches make them stale). */
  #planned = 0;
  readonly #tail: StepTail;
  #prefills = new Map<string, Dispatch[]>();
  #prefillTails = new Map<string, Dispatch[]>();
  #scores = new Map<string, Dispatch[]>();
  #scoreOut?: { logits: GPUBuffer; stats: GPUBuffer };

  constructor(
    readonly gpu: Gpu,
    readonly cfg: ModelConfig,
    readonly w: ModelWeights,
    o: {
      kv: KvPool;
      slots: SlotBuffers;
      layout: SlotLayout;
      maxChunk: number;
      mask?: AttentionMask;
      draftPool?: boolean;
      constraints: SlotConstraints;
      monitor?: PrecisionMonitor;
    },
  ) {
    this.#kv = o.kv;
    this.#monitor = o.monitor;
    this.mask = o.mask ?? CAUSAL;
    this.buckets = lengthBuckets(o.layout.shape.contextLength, this.mask);
    this.#slots = o.slots;
    this.#layout = o.layout;
    this.maxChunk = o.maxChunk;
    // S: rows that get logits (a verification pass: every slot's rows); T: rows of the layers.
    const S = o.layout.shape.maxSlots * o.layout.rows, T = Math.max(o.maxChunk, S);
    const { hiddenSize: H, nHeads, nKvHeads, headDim: D, intermediateSize: F } = cfg;
    const V = cfg.vocabSize;
    const buf = (bytes: number, label: string) => createStorage(gpu, bytes, undefined, label);
    const qkvCols = (nHeads + 2 * nKvHeads) * D;
    this.#x = buf(T * H * 4, "x");
    this.#qkv = buf(T * qkvCols * 4, "qkv");
    this.#q = buf(T * nHeads * D * 4, "q");
    this.#attn = buf(T * nHeads * D * 4, "attn");
    this.#act = buf(T * F * 4, "act");
    this.#last = buf(S * H * 4, "last");
    this.#logits = buf(S * V * 4, "logits");
    this.#stats = buf(S * 16, "stats");
    this.#prefillTok = buf(T * 4, "prefill_tok");
    this.#prefillPos = buf(T * 4, "prefill_pos");
    this.#prefillSeq = buf(T * 4, "prefill_seq");
    this.#lastRow = buf(4, "last_row");
    this.#prefillChunk = buf(16, "prefill_chunk");
    this.#tail = new StepTail(gpu, V, {
      slots: o.slots,
      layout: o.layout,
      constraints: o.constraints,
      logits: this.#logits,
      stats: this.#stats,
      x: this.#x,
      lastRow: this.#lastRow,
      hidden: cfg.hiddenSize,
    });
    this.#verify = new VerifyPlans({
      gpu,
      cfg,
      w,
      kv: o.kv,
      slots: o.slots,
      layout: o.layout,
      tail: this.#tail,
      pool: o.draftPool ?? true,
      x: this.#x,
      qkv: this.#qkv,
      q: this.#q,
      attn: this.#attn,
      layers: (m, attention) => this.#layers(m, attention),
      heads: (layer) => this.#heads(layer),
      lmHead: (m) => this.#lmHead(m, 0, this.#x, this.w.norm),
    });
    // The longer buckets' pipelines now, so the first long request does not wait for them.
    warmDecodeBuckets(gpu, this.buckets.slice(1), o.layout.shape.maxSlots, {
      nHeads: cfg.nHeads,
      nKvHeads: cfg.nKvHeads,
      headDim: cfg.headDim,
      kvDtype: o.kv.dtype,
      codec: o.kv.region,
      mask: this.mask,
    });
  }

  /**
   * The transformer layers over `m` rows of `x`. `attention(layer)` supplies the step from
   * `qkv` to `attn`: RoPE, the KV write and attention (one or two dispatches). With `live` (the
   * rows that hold tokens), the pass also measures every projection's input for the precision
   * monitor (engine/runner/monitor.ts).
   */
  #layers(m: number, attention: (layer: number) => Dispatch[], live?: LiveRows): Dispatch[] {
    const { gpu, cfg, w } = this;
    const x = this.#x, eps = cfg.rmsEps;
    const mon = live && this.#monitor?.enabled ? this.#monitor : undefined;
    const out: Dispatch[] = mon ? [mon.clear()] : [];
    w.layers.forEach((layer, l) => {
      const L = this.#monitor?.layer(l) ?? layer; // its 16-bit weights after a fallback
      const measure = (p: "qkv" | "o" | "gateUp" | "down") => mon?.measure(l, p, live);
      // Attention block: qkv = norm(x)·Wqkvᵀ (+b), the RMSNorm folded into the matmul; RoPE, KV
      // write; attend; x += o·Woᵀ
      out.push(...matmulDispatches(gpu, {
        x,
        w: L.qkv,
        y: this.#qkv,
        bias: L.qkvBias,
        normWeight: L.attnNorm,
        measure: measure("qkv"),
      }, { m, eps }));
      out.push(...attention(l));
      out.push(...matmulDispatches(gpu, {
        x: this.#attn,
        w: L.o,
        y: x,
        bias: L.oBias,
        measure: measure("o"),
      }, { m, accumulate: true }));
      // MLP block: act = silu(norm(x)·Wgᵀ) ⊙ norm(x)·Wuᵀ in one matmul (gate/up rows
      // interleaved); x += act·Wdᵀ
      out.push(...matmulDispatches(gpu, {
        x,
        w: L.gateUp,
        y: this.#act,
        normWeight: L.mlpNorm,
        measure: measure("gateUp"),
      }, { m, eps, swiglu: true }));
      out.push(
        ...matmulDispatches(gpu, { x: this.#act, w: L.down, y: x, measure: measure("down") }, {
          m,
          accumulate: true,
        }),
      );
    });
    return out;
  }

  /** Drops the built plans when the monitor switched a layer's precision since they were built. */
  #sync(): void {
    const v = this.#monitor?.version ?? 0;
    if (v === this.#planned) return;
    this.#planned = v;
    this.#decodePlans.clear();
    this.#monitoredPlans.clear();
    this.#verify.clear();
    this.#prefills.clear();
  }

  #heads(layer: number) {
    const c = this.cfg;
    return {
      nHeads: c.nHeads,
      nKvHeads: c.nKvHeads,
      headDim: c.headDim,
      layer,
      nLayers: c.nLayers,
      maxBlocks: this.#layout.maxBlocks,
      kvDtype: this.#kv.dtype,
      codec: this.#kv.region, // blocks behind the hot window, decoded by attention as read
      // yarn's cos/sin factor, squared (engine/model/config.ts), and the model's mask.
      scale: attentionScale(c),
      mask: this.mask,
    };
  }

  /** LM head over `m` rows of `x` into rows [row0, ..) of `y` (default: the logits). */
  #lmHead(m: number, row0: number, x: GPUBuffer, normWeight?: GPUBuffer, y = this.#logits) {
    return lmHeadDispatches(this.gpu, this.cfg, this.w.lmHead, { m, row0, x, normWeight, y });
  }

  /**
   * Rows a prefill chunk of `count` tokens runs as: its size class (powers of two up to 32,
   * then multiples of 32, at most maxChunk). Launches are built once per class, and the chunk's
   * slot, position and length are read from buffers when it runs: building one costs about
   * 85 µs of host time per dispatch (15 ms for a TinyLlama chunk on the H200's host), which a
   * request with a prompt length, slot or position not seen before would otherwise pay.
   */
  prefillRows(count: number): number {
    const rows = count <= 32 ? 2 ** Math.ceil(Math.log2(count)) : Math.ceil(count / 32) * 32;
    return Math.min(rows, this.maxChunk);
  }

  /**
   * Prefill of `count` tokens of slot `slot` starting at position `pos0` (already written into
   * the prefill buffers by {@linkcode writePrefill}). With `last`, also computes the last
   * token's logits, samples the first new token and records it at (region, step 0).
   */
  prefill(
    count: number,
    o: { slot: number; pos0: number; last: boolean; region: number } & TailFlags,
  ): Dispatch[] {
    this.#sync();
    const rows = this.prefillRows(count);
    const body = memo(this.#prefills, `${rows}`, () => this.#buildPrefill(rows), 64);
    if (!o.last) return body;
    const H = this.cfg.hiddenSize;
    // The last token's logits (its row is in `lastRow`), into the slot's row.
    const logits = memo(this.#prefillTails, `${o.slot}`, () => [
      rmsnormDispatch(this.gpu, {
        x: this.#x,
        weight: this.w.norm,
        out: this.#last,
        rows: this.#lastRow,
      }, {
        count: 1,
        cols: H,
        eps: this.cfg.rmsEps,
      }),
      ...this.#lmHead(1, o.slot, this.#last),
    ]);
    return [
      ...body,
      ...logits,
      ...this.#tail.sample(o.slot + 1, o.region, 0, o, 1, o.slot),
      ...this.#tail.stepEnd(o.slot, o.slot + 1, o.region, 0, o, true),
    ];
  }

  /**
   * Tokens a scoring chunk takes at most: a prefill chunk, or fewer where its logits
   * (`[tokens, V]` f32) would pass 64 MiB.
   */
  scoreChunk(): number {
    return Math.max(1, Math.min(this.maxChunk, Math.floor(2 ** 26 / (4 * this.cfg.vocabSize))));
  }

  /**
   * A scoring chunk of `count` tokens (written by {@linkcode writePrefill}): the prefill's
   * layers (KV written as a prefill writes it), then the logits of every row, normed, into
   * `logits` `[rows, V]` and their max / log-sum-exp / argmax into `stats`
   * (kernels/logits.ts STATS_BYTES per row).
   */
  score(count: number): { dispatches: Dispatch[]; logits: GPUBuffer; stats: GPUBuffer } {
    if (!(count >= 1 && count <= this.scoreChunk())) {
      throw new Error(`internal error: a scoring chunk of ${count} tokens`);
    }
    const rows = this.prefillRows(count), V = this.cfg.vocabSize, T = this.scoreChunk();
    this.#scoreOut ??= {
      logits: createStorage(this.gpu, T * V * 4, undefined, "score_logits"),
      stats: createStorage(this.gpu, T * 16, undefined, "score_stats"),
    };
    const { logits, stats } = this.#scoreOut;
    this.#sync();
    const body = memo(this.#prefills, `${rows}`, () => this.#buildPrefill(rows), 64);
    const tail = memo(this.#scores, `${count}`, () => [
      ...this.#lmHead(count, 0, this.#x, this.w.norm, logits),
      logitsStatsDispatch(this.gpu, { logits, stats }, { rows: count, vocab: V }),
    ]);
    return { dispatches: [...body, ...tail], logits, stats };
  }

  /** A prefill chunk's embedding and layers for up to `rows` tokens (see prefillRows). */
  #buildPrefill(rows: number): Dispatch[] {
    const g = this.gpu;
    return [
      embeddingDispatch(g, { table: this.w.embed, tokens: this.#prefillTok, out: this.#x }, {
        count: rows,
      }),
      // RoPE and KV write of the chunk (q → `q`), then causal attention over the slot's cache.
      ...this.#layers(rows, (layer) => [
        ropeKvDispatch(g, {
          qkv: this.#qkv,
          q: this.#q,
          kPool: this.#kv.k,
          vPool: this.#kv.v,
          pos: this.#prefillPos,
          tokSeq: this.#prefillSeq,
          blockTable: this.#slots.blockTable,
          invFreq: this.w.invFreq,
        }, { tokens: rows, ...this.#heads(layer) }),
        attentionDispatch(g, {
          q: this.#q,
          kPool: this.#kv.k,
          vPool: this.#kv.v,
          blockTable: this.#slots.blockTable,
          out: this.#attn,
          chunk: this.#prefillChunk,
        }, { tokens: rows, ...this.#heads(layer) }),
      ], { buffer: this.#prefillChunk, kind: "chunk" }),
    ];
  }

  /**
   * Writes one prefill chunk's token ids, positions and shape (queue-ordered before the
   * submit). The rows up to its size class (see prefillRows) are padding: token 0 at the trash
   * position, so their KV lands in the trash block; attention skips them, and the matmuls'
   * results for them are never read.
   *
   * @throws Error ("internal error") when the chunk is empty, exceeds maxChunk or runs past
   *   the context.
   */
  writePrefill(ids: number[], slot: number, pos0: number): void {
    const n = ids.length, rows = this.prefillRows(n);
    if (!(n >= 1 && n <= this.maxChunk && pos0 + n <= this.#layout.shape.contextLength)) {
      throw new Error(`internal error: prefill of ${n} tokens at ${pos0}`);
    }
    const q = this.gpu.device.queue;
    const tok = new Uint32Array(rows), pos = new Uint32Array(rows).fill(this.#layout.trashPos);
    tok.set(ids);
    for (let i = 0; i < n; i++) pos[i] = pos0 + i;
    q.writeBuffer(this.#prefillTok, 0, tok);
    q.writeBuffer(this.#prefillPos, 0, pos);
    q.writeBuffer(this.#prefillSeq, 0, new Uint32Array(rows).fill(slot));
    q.writeBuffer(this.#lastRow, 0, Uint32Array.of(n - 1));
    q.writeBuffer(this.#prefillChunk, 0, chunkWords(slot, pos0, n));
  }

  /**
   * One decode step of slots [0, slots): everything between two sampled tokens. `keys`: the most
   * keys a slot holds (default the context length); decode attention runs the plan of its length
   * bucket (any plan is correct for any length; the bucket's is the fast one).
   */
  decodeStep(
    slots: number,
    region: number,
    k: number,
    f: TailFlags,
    keys = this.#layout.shape.contextLength,
  ): Dispatch[] {
    this.#sync();
    const bucket = bucketFor(this.buckets, attendedKeys(this.mask, keys + this.#layout.rows - 1));
    const key = `${slots}:${bucket}`;
    // The first step of a submission measures for the precision monitor (a submission's
    // readback carries the measurements; the other steps skip the cost).
    const monitored = k === 0 && (this.#monitor?.enabled ?? false);
    const plans = monitored ? this.#monitoredPlans : this.#decodePlans;
    let body = plans.get(key);
    if (!body) {
      const g = this.gpu, c = this.cfg;
      body = [
        stepDispatch(g, this.#slots.step, {
          entry: "step_begin",
          slotBegin: 0,
          slotEnd: slots,
          vocab: c.vocabSize,
          trashPos: this.#layout.trashPos,
          nEos: this.#slots.eosCount,
        }),
        embeddingDispatch(g, {
          table: this.w.embed,
          tokens: this.#slots.step.nextTok,
          out: this.#x,
        }, {
          count: slots,
        }),
        // RoPE and the KV write at `pos` (step_begin's: the trash position for finished slots)
        // happen inside decode attention: one dispatch, or splits + combine.
        ...this.#layers(slots, (layer) =>
          attentionDecodeDispatches(g, {
            qkv: this.#qkv,
            pos: this.#slots.step.pos,
            invFreq: this.w.invFreq,
            kPool: this.#kv.k,
            vPool: this.#kv.v,
            blockTable: this.#slots.blockTable,
            seqLen: this.#slots.step.seqLen,
            out: this.#attn,
          }, {
            seqs: slots,
            maxContext: bucket,
            ...this.#heads(layer),
          }), monitored ? { buffer: this.#slots.step.slotState, kind: "done" } : undefined),
        // Final norm folded into the LM head: logits = norm(x) · W_lmᵀ
        ...this.#lmHead(slots, 0, this.#x, this.w.norm),
      ];
      plans.set(key, body);
    }
    return [
      ...body,
      ...this.#tail.sample(slots, region, k, f),
      ...this.#tail.stepEnd(0, slots, region, k, f),
    ];
  }

  /**
   * One verification pass of speculative decoding over slots [0, slots), R rows each
   * (engine/runner/verify.ts), at (region, k); with `check`, cross-checked against the plain
   * path. `keys` as for {@linkcode decodeStep}.
   */
  verifyStep(
    slots: number,
    R: number,
    at: { region: number; k: number; check?: boolean },
    f: TailFlags,
    keys = this.#layout.shape.contextLength,
  ): Dispatch[] {
    this.#sync();
    // Row j of a slot attends j more keys than the slot holds: the bucket of the last row's.
    const bucket = bucketFor(this.buckets, attendedKeys(this.mask, keys + this.#layout.rows - 1));
    return this.#verify.step(slots, R, { ...at, f, bucket, check: at.check ?? false });
  }
}
