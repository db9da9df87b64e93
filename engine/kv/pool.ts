/**
 * The KV cache's GPU memory: one K and one V buffer. Block b < `hot` (a hot block) sits at byte
 * `b · blockBytes` of both, laid out `[layer, kv head, 16 rows, head_dim]` of the cache's dtype
 * (the attention kernels' addressing, docs/internals.md). With a KV codec (`--kv-codec`,
 * docs/kv_codecs.md) the same buffers hold codec blocks after the hot ones: block `hot + c` at
 * byte `hot · blockBytes + c · codecBytes`, re-encoded from hot blocks behind the hot window
 * (engine/kv/recency.ts) and read by attention as they are. The pool's bookkeeping (which block
 * holds what) is `blocks`; this module is the only one that copies blocks in and out.
 */
import { createStorage, type Gpu } from "../../gpu/device.ts";
import { KV_BYTES, type KvDtype } from "../../gpu/dtype.ts";
import { encode } from "../../gpu/dispatch.ts";
import {
  codecBlockBytes,
  codecRegion,
  type KvCodec,
  kvCodecDispatch,
  type KvCodecRegion,
  pairsBuffer,
} from "../../kernels/kv_codec.ts";
import type { ModelConfig } from "../model/config.ts";
import { BLOCK, BlockPool } from "./blocks.ts";

/** Bytes one KV block takes in each of the K and V pools. */
export function kvBlockBytes(
  cfg: Pick<ModelConfig, "nLayers" | "nKvHeads" | "headDim">,
  dtype: KvDtype,
): number {
  return cfg.nLayers * cfg.nKvHeads * BLOCK * cfg.headDim * KV_BYTES[dtype];
}

/** Options of {@linkcode KvPool}. */
export interface KvPoolOptions {
  /** Hot blocks in each pool, the trash block 0 included. */
  numBlocks: number;
  dtype: KvDtype;
  /** What blocks behind the hot window become (default none: no codec region). */
  codec?: KvCodec;
  /** Codec blocks after the hot ones (with a codec). */
  codecBlocks?: number;
}

/** Most blocks one encode or decode dispatch takes (its grid's y). */
const MAX_ITEMS = 65535;

/** The K and V pools on the GPU and the bookkeeping of their blocks. */
export class KvPool {
  /** K of every block: hot blocks `[hot, layers, kv heads, 16, head_dim]`, then codec blocks. */
  readonly k: GPUBuffer;
  /** V, laid out as `k`. */
  readonly v: GPUBuffer;
  /** Bytes of one hot block in each of `k` and `v`. */
  readonly blockBytes: number;
  /** Bytes of one codec block in each of `k` and `v` (0 without a codec). */
  readonly codecBytes: number;
  readonly dtype: KvDtype;
  readonly codec: KvCodec;
  /** Where codec blocks live, for the kernels that read them (none without a codec). */
  readonly region?: KvCodecRegion;
  /** Which block holds what: reference counts and content hashes. */
  readonly blocks: BlockPool;
  /** Bytes of each of `k` and `v`. */
  readonly poolBytes: number;

  /**
   * @throws Error when a pool would exceed the adapter's largest binding
   */
  constructor(readonly gpu: Gpu, readonly cfg: ModelConfig, opts: KvPoolOptions) {
    this.dtype = opts.dtype;
    this.codec = opts.codec ?? "none";
    this.blockBytes = kvBlockBytes(cfg, opts.dtype);
    const codecBlocks = this.codec === "none" ? 0 : opts.codecBlocks ?? 0;
    if (this.codec !== "none") {
      this.region = codecRegion(cfg, { codec: this.codec, dtype: this.dtype, hot: opts.numBlocks });
    }
    this.codecBytes = this.codec === "none" ? 0 : codecBlockBytes(cfg, this.codec);
    const bytes = this.poolBytes = opts.numBlocks * this.blockBytes +
      codecBlocks * this.codecBytes;
    if (bytes > gpu.maxBinding) {
      throw new Error(
        `internal error: a KV pool of ${opts.numBlocks} + ${codecBlocks} blocks is ${bytes} ` +
          `bytes; this adapter binds at most ${gpu.maxBinding}`,
      );
    }
    this.k = createStorage(gpu, bytes, undefined, "k_pool");
    this.v = createStorage(gpu, bytes, undefined, "v_pool");
    this.blocks = new BlockPool(opts.numBlocks, codecBlocks);
  }

  /** Bytes of block `id` in each of `k` and `v`: a hot block's, or a codec block's. */
  blockBytesOf(id: number): number {
    return this.blocks.isCodec(id) ? this.codecBytes : this.blockBytes;
  }

  /** Byte of block `id` in each of `k` and `v`. */
  #offset(id: number): number {
    const hot = this.blocks.hot;
    return id < hot ? id * this.blockBytes : hot * this.blockBytes + (id - hot) * this.codecBytes;
  }

  /**
   * Queues the re-encoding of hot blocks into codec blocks: `pairs` of (hot block, codec block).
   * Queue order makes work submitted before read the hot blocks as they were, and work submitted
   * after find the codec blocks written.
   *
   * @throws Error ("internal error") without a codec, or for a pair that is not (hot, codec)
   */
  encode(pairs: readonly (readonly [number, number])[]): void {
    const region = this.region, b = this.blocks;
    if (!region) throw new Error("internal error: re-encoding blocks of a pool without a codec");
    const bad = pairs.find(([from, to]) => b.isCodec(from) || !b.isCodec(to));
    if (bad) throw new Error(`internal error: re-encoding block ${bad[0]} into ${bad[1]}`);
    if (!pairs.length) return;
    const dev = this.gpu.device, enc = dev.createCommandEncoder(), used: GPUBuffer[] = [];
    const pass = enc.beginComputePass();
    for (let i = 0; i < pairs.length; i += MAX_ITEMS) {
      const part = pairs.slice(i, i + MAX_ITEMS), list = pairsBuffer(this.gpu, part);
      const d = kvCodecDispatch(this.gpu, "encode", { pairs: list, kPool: this.k, vPool: this.v }, {
        ...this.cfg,
        items: part.length,
        dtype: this.dtype,
        region,
      });
      encode(pass, [d]);
      used.push(list, d.uniform);
    }
    pass.end();
    dev.queue.submit([enc.finish()]);
    for (const b of used) b.destroy(); // after the submit: destroyed once the work is done
  }

  /**
   * Queues a copy of blocks `ids` into a new mappable buffer (not yet mapped). By default every
   * block comes out in the hot form, codec blocks decoded on the GPU: block i's K then V at
   * byte `2 i · blockBytes`. With `raw`, each block as it is held ({@linkcode blockBytesOf}),
   * K then V, one after another in order (block i at the sum of the earlier blocks' two sizes).
   * Queue order makes it a copy of what the work submitted so far wrote, whatever is submitted
   * later.
   */
  copyOut(ids: readonly number[], o: { raw?: boolean } = {}): GPUBuffer {
    const dev = this.gpu.device, bb = this.blockBytes;
    const size = (id: number) => o.raw ? this.blockBytesOf(id) : bb;
    const staging = dev.createBuffer({
      size: Math.max(4, ids.reduce((n, id) => n + 2 * size(id), 0)),
      usage: GPUBufferUsage.MAP_READ | GPUBufferUsage.COPY_DST,
    });
    const enc = dev.createCommandEncoder();
    // Codec blocks decoded into the hot form first (K‖V per block, in scratch buffers each within
    // one binding), then copied like hot blocks.
    const decoded = o.raw ? [] : ids.filter((id) => this.blocks.isCodec(id));
    const per = Math.max(1, Math.min(MAX_ITEMS, Math.floor(this.gpu.maxBinding / (2 * bb))));
    const scratch: GPUBuffer[] = [], used: GPUBuffer[] = [];
    if (decoded.length) {
      const pass = enc.beginComputePass();
      for (let i = 0; i < decoded.length; i += per) {
        const part = decoded.slice(i, i + per);
        const out = createStorage(this.gpu, 2 * part.length * bb, undefined, "kv decode");
        const list = pairsBuffer(this.gpu, part.map((id, j) => [id, j]));
        const d = kvCodecDispatch(this.gpu, "decode", {
          pairs: list,
          kPool: this.k,
          vPool: this.v,
          out,
        }, { ...this.cfg, items: part.length, dtype: this.dtype, region: this.region! });
        encode(pass, [d]);
        scratch.push(out);
        used.push(list, d.uniform, out);
      }
      pass.end();
    }
    let at = 0, j = 0;
    for (const id of ids) {
      const n = size(id);
      if (!o.raw && this.blocks.isCodec(id)) {
        enc.copyBufferToBuffer(
          scratch[Math.floor(j / per)],
          2 * (j % per) * bb,
          staging,
          at,
          2 * bb,
        );
        j++;
      } else {
        enc.copyBufferToBuffer(this.k, this.#offset(id), staging, at, n);
        enc.copyBufferToBuffer(this.v, this.#offset(id), staging, at + n, n);
      }
      at += 2 * n;
    }
    dev.queue.submit([enc.finish()]);
    for (const b of used) b.destroy();
    return staging;
  }

  /**
   * Writes one block's K‖V bytes: `2 · blockBytesOf(id)`, as {@linkcode copyOut} lays them out
   * (its hot form for a hot block, `raw` for a codec block).
   */
  write(id: number, raw: Uint8Array): void {
    const q = this.gpu.device.queue, n = this.blockBytesOf(id), at = this.#offset(id);
    if (raw.byteLength !== 2 * n) {
      throw new Error(`internal error: KV block ${id} is ${2 * n} bytes; got ${raw.byteLength}`);
    }
    // The host tier's buffers are shared memory (engine/kv/tier_host.ts). WebGPU's IDL types
    // leave shared views out of writeBuffer's argument; Deno's takes them, bytes intact
    // (tests/kv_tier_io_test.ts round-trips blocks through them).
    const data = raw as Uint8Array<ArrayBuffer>;
    q.writeBuffer(this.k, at, data, 0, n);
    q.writeBuffer(this.v, at, data, n, n);
  }
}
