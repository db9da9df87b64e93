/**
 * The KV cache's GPU memory: one K and one V buffer of `numBlocks` blocks each, block b at byte
 * `b · blockBytes` of both, laid out `[layer, kv head, 16 rows, head_dim]` of the cache's dtype
 * (the attention kernels' addressing, docs/internals.md). The pool's bookkeeping (which block
 * holds what) is `blocks`; this module is the only one that copies blocks in and out.
 */
import { createStorage, type Gpu } from "../../gpu/device.ts";
import { KV_BYTES, type KvDtype } from "../../gpu/dtype.ts";
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
  /** Blocks in each pool, the trash block 0 included. */
  numBlocks: number;
  dtype: KvDtype;
}

/** The K and V pools on the GPU and the bookkeeping of their blocks. */
export class KvPool {
  /** K of every block: `[numBlocks, layers, kv heads, 16, head_dim]` of `dtype`. */
  readonly k: GPUBuffer;
  /** V, laid out as `k`. */
  readonly v: GPUBuffer;
  /** Bytes of one block in each of `k` and `v`. */
  readonly blockBytes: number;
  readonly dtype: KvDtype;
  /** Which block holds what: reference counts and content hashes. */
  readonly blocks: BlockPool;

  /**
   * @throws Error when a pool would exceed the adapter's largest binding
   */
  constructor(readonly gpu: Gpu, cfg: ModelConfig, opts: KvPoolOptions) {
    this.dtype = opts.dtype;
    this.blockBytes = kvBlockBytes(cfg, opts.dtype);
    const bytes = opts.numBlocks * this.blockBytes;
    if (bytes > gpu.maxBinding) {
      throw new Error(
        `internal error: a KV pool of ${opts.numBlocks} blocks is ${bytes} bytes; ` +
          `this adapter binds at most ${gpu.maxBinding}`,
      );
    }
    this.k = createStorage(gpu, bytes, undefined, "k_pool");
    this.v = createStorage(gpu, bytes, undefined, "v_pool");
    this.blocks = new BlockPool(opts.numBlocks);
  }

  /**
   * Bytes block `id` takes in each of `k` and `v`: its K‖V record ({@linkcode copyOut},
   * {@linkcode write}) is twice that. The tiers below the GPU treat a record as opaque bytes of
   * this size, so blocks of another layout need only answer here.
   */
  blockBytesOf(_id: number): number {
    return this.blockBytes;
  }

  /**
   * Queues a copy of blocks `ids` into a new mappable buffer (not yet mapped): their K‖V
   * records one after another, block i's K then V at the sum of the records before it
   * ({@linkcode blockBytesOf}). Queue order makes it a copy of what the work submitted so far
   * wrote, whatever is submitted later.
   */
  copyOut(ids: readonly number[]): GPUBuffer {
    const dev = this.gpu.device;
    const size = ids.reduce((n, id) => n + 2 * this.blockBytesOf(id), 0);
    const staging = dev.createBuffer({
      size: Math.max(4, size),
      usage: GPUBufferUsage.MAP_READ | GPUBufferUsage.COPY_DST,
    });
    const enc = dev.createCommandEncoder();
    let at = 0;
    for (const id of ids) {
      const bb = this.blockBytesOf(id);
      enc.copyBufferToBuffer(this.k, id * this.blockBytes, staging, at, bb);
      enc.copyBufferToBuffer(this.v, id * this.blockBytes, staging, at + bb, bb);
      at += 2 * bb;
    }
    dev.queue.submit([enc.finish()]);
    return staging;
  }

  /** Writes one block's K‖V record (`2 · blockBytesOf(id)` bytes, as {@linkcode copyOut} lays it out). */
  write(id: number, raw: Uint8Array<ArrayBuffer>): void {
    const q = this.gpu.device.queue, bb = this.blockBytesOf(id);
    if (raw.byteLength !== 2 * bb) {
      throw new Error(`internal error: KV block ${id} is ${2 * bb} bytes; got ${raw.byteLength}`);
    }
    q.writeBuffer(this.k, id * this.blockBytes, raw, 0, bb);
    q.writeBuffer(this.v, id * this.blockBytes, raw, bb, bb);
  }
}
