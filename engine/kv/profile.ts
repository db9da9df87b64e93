/**
 * The StorageTierProfile: measured at start-up with real reads and writes of each tier, a few MB
 * each (docs/kv_tiers.md). GPU → host: blocks copied out of the pool and mapped (what a spill
 * does); host → GPU: records written into free blocks and the queue waited on (a restore);
 * host ↔ file: records written to and read back from the spill folder; the snapshot store and a
 * prefill chunk through probes the engine gives. A tier is used only when bringing a block back
 * from it is faster than recomputing the block's 16 tokens; the prefetch distance is how many
 * reads it takes to hide one read's latency.
 *
 * Deno resolves GPU waits on a 10 ms timer (docs/internals.md): each path's fixed cost is
 * measured alone (an empty round trip) and reported as its latency, and the throughput is of
 * the rest.
 */
import type { StorageTierProfile, TierRate, TierUse } from "../../api/types.ts";
import { isCpuAdapter } from "../../gpu/device.ts";
import { BLOCK } from "./blocks.ts";
import type { KvTiers } from "./tiers.ts";

/** What the engine measures for the profile besides the tiers' own paths. */
export interface ProfileProbes {
  /** Times prefill on the GPU: tokens computed and the GPU time they took (ms). */
  prefill(): Promise<{ tokens: number; ms: number }>;
  /** Writes `records` through the snapshot store and reads them back (ms each way). */
  store?(records: Uint8Array<ArrayBuffer>[]): Promise<{ writeMs: number; readMs: number }>;
}

/** Bytes moved per path (at least two records); a quarter on a CPU adapter, where it is slow. */
const PROBE_BYTES = 8 << 20;
/** Bytes through the snapshot store (at least one record): it packs at ≈ 200 MiB/s. */
const STORE_PROBE_BYTES = 2 << 20;
/** File reads and writes in flight while their throughput is measured. */
const FILE_CONCURRENCY = 8;
/** Reads a restore keeps in flight at least (a file read is several async operations) and most. */
const MIN_PREFETCH = 4;
const MAX_PREFETCH = 64;

/**
 * The rate of `bytes` moved in `ms`, of which `latencyMs` is the path's fixed cost. The fixed
 * cost is measured apart and both carry Deno's timer jitter: at most 90 % of `ms` is taken off,
 * so a noisy latency cannot make the rate absurd.
 */
const rate = (bytes: number, ms: number, latencyMs: number): TierRate => ({
  gbPerS: bytes / 1e6 / Math.max(1e-3, ms - Math.min(latencyMs, 0.9 * ms)),
  latencyMs,
});

/** Milliseconds one block of `bytes` takes at `r`'s throughput. */
const blockMs = (bytes: number, r: TierRate) => bytes / 1e6 / r.gbPerS;

async function timed<T>(f: () => Promise<T>): Promise<[T, number]> {
  const t = performance.now();
  const v = await f();
  return [v, performance.now() - t];
}

/** Runs `tasks` with at most `n` in flight. */
async function limited(tasks: (() => Promise<unknown>)[], n: number): Promise<void> {
  let next = 0;
  const worker = async () => {
    while (next < tasks.length) await tasks[next++]();
  };
  await Promise.all(Array.from({ length: Math.min(n, tasks.length) }, worker));
}

/**
 * Measures the profile of `tiers` (its pool, host memory, file tier) with `probes`. Run it while
 * the engine is idle and before sessions are restored: it writes into free GPU blocks.
 */
export async function measureProfile(
  tiers: KvTiers,
  probes: ProfileProbes,
): Promise<StorageTierProfile> {
  const start = performance.now(), pool = tiers.pool, dev = pool.gpu.device;
  const rec = 2 * pool.blockBytes, probe = isCpuAdapter(pool.gpu) ? PROBE_BYTES / 4 : PROBE_BYTES;
  const n = Math.max(2, Math.min(Math.ceil(probe / rec), pool.blocks.blocks.length - 1));
  const ids = Array.from({ length: n }, (_, i) => 1 + (i % (pool.blocks.blocks.length - 1)));
  const bytes = n * rec;

  // GPU → host, as a spill: copy out, map, copy into host buffers. The second run counts.
  const mapLatency = (await timed(async () => {
    const b = pool.copyOut([]);
    await b.mapAsync(GPUMapMode.READ);
    b.destroy();
  }))[1];
  let records: Uint8Array<ArrayBuffer>[] = [], spillMs = Infinity;
  for (let run = 0; run < 2; run++) {
    const [got, ms] = await timed(async () => {
      const staging = pool.copyOut(ids);
      await staging.mapAsync(GPUMapMode.READ);
      const out = ids.map((_, i) => new Uint8Array(staging.getMappedRange(i * rec, rec).slice(0)));
      staging.destroy();
      return out;
    });
    records = got;
    spillMs = Math.min(spillMs, ms);
  }
  const gpuToHost = rate(bytes, spillMs, mapLatency);

  // Host → GPU, as a restore: write records into free blocks, wait for the queue.
  const wait = (await timed(() => dev.queue.onSubmittedWorkDone()))[1];
  let uploadMs = Infinity;
  for (let run = 0; run < 2; run++) {
    const [, ms] = await timed(async () => {
      ids.forEach((id, i) => pool.write(id, records[i]));
      dev.queue.submit([]);
      await dev.queue.onSubmittedWorkDone();
    });
    uploadMs = Math.min(uploadMs, ms);
  }
  const hostToGpu = rate(bytes, uploadMs, wait);

  // Host ↔ file, as the file tier moves blocks: several writes and reads in flight.
  let hostToFile: TierRate | undefined, fileToHost: TierRate | undefined, singleReadMs = 0;
  const file = tiers.file;
  if (file) {
    const hashes = records.map(() => probeHash());
    try {
      const one = (await timed(() => file.write(hashes[0], [], records[0])))[1];
      const [, writeMs] = await timed(() =>
        limited(hashes.map((h, i) => () => file.write(h, [], records[i])), FILE_CONCURRENCY)
      );
      // Shared memory, as the host tier's buffers: read on the tier's reader threads.
      const into = records.map((r) => new Uint8Array(new SharedArrayBuffer(r.byteLength)));
      // Restores find the reader threads running: their start is not the tier's speed.
      await file.startReaders();
      singleReadMs = (await timed(() => file.read(hashes[0], [], into[0])))[1];
      const [, readMs] = await timed(() =>
        limited(hashes.map((h, i) => () => file.read(h, [], into[i])), FILE_CONCURRENCY)
      );
      hostToFile = rate(bytes, writeMs, 0);
      fileToHost = rate(bytes, readMs, 0);
      hostToFile.latencyMs = Math.max(0, one - blockMs(rec, hostToFile));
      fileToHost.latencyMs = Math.max(0, singleReadMs - blockMs(rec, fileToHost));
    } finally {
      await Promise.all(hashes.map((h) => file.remove(h)));
    }
  }

  // The snapshot store (Deno KV), packing included.
  let kvWrite: TierRate | undefined, kvRead: TierRate | undefined;
  if (probes.store) {
    const k = Math.max(1, Math.min(records.length, Math.floor(STORE_PROBE_BYTES / rec)));
    const sample = records.slice(0, k).map(kvLike);
    const r = await probes.store(sample);
    kvWrite = rate(k * rec, r.writeMs, 0);
    kvRead = rate(k * rec, r.readMs, 0);
  }

  const p = await probes.prefill();
  const recomputeTokensPerS = p.tokens / (Math.max(1e-3, p.ms) / 1000);
  const recomputeMsPerBlock = (BLOCK / recomputeTokensPerS) * 1000;
  const use = (name: string, ms: number): TierUse => ({
    use: ms < recomputeMsPerBlock,
    restoreMsPerBlock: ms,
    reason: `${name}: a block comes back in ${ms.toFixed(3)} ms, recomputing it takes ` +
      `${recomputeMsPerBlock.toFixed(3)} ms`,
  });
  const up = blockMs(rec, hostToGpu);
  // Enough reads in flight that one read's wait is covered by the transfers of the others.
  const prefetchBlocks = fileToHost
    ? Math.max(
      MIN_PREFETCH,
      Math.min(MAX_PREFETCH, Math.ceil(singleReadMs / (blockMs(rec, fileToHost) + up))),
    )
    : 8;
  return {
    measuredAt: Date.now(),
    measureMs: performance.now() - start,
    blockBytes: rec,
    recomputeTokensPerS,
    recomputeMsPerBlock,
    gpuToHost,
    hostToGpu,
    ...(hostToFile ? { hostToFile, fileToHost } : {}),
    ...(kvWrite ? { kvWrite, kvRead } : {}),
    host: use("host memory", up),
    ...(fileToHost ? { file: use("files", blockMs(rec, fileToHost) + up) } : {}),
    ...(kvRead ? { kv: use("the snapshot store", blockMs(rec, kvRead!) + up) } : {}),
    prefetchBlocks,
  };
}

/** A random hash for probe files (removed right after; a real block's hash is chained). */
function probeHash(): bigint {
  const w = crypto.getRandomValues(new Uint32Array(2));
  return (BigInt(w[1]) << 32n) | BigInt(w[0]);
}

/**
 * A record of KV-like values for the store's probe: the pool's blocks are zeros at start-up,
 * which deflate far better than real keys and values would. Values are drawn as a cache holds
 * them: f32 around a unit scale (the low bytes noisy, the high ones not).
 */
function kvLike(r: Uint8Array<ArrayBuffer>): Uint8Array<ArrayBuffer> {
  const out = new Float32Array(r.byteLength / 4);
  let s = 0x2545f491;
  for (let i = 0; i < out.length; i++) {
    s ^= s << 13;
    s ^= s >>> 17;
    s ^= s << 5;
    out[i] = ((s >>> 0) / 4294967296 - 0.5) * 4;
  }
  return new Uint8Array(out.buffer);
}
