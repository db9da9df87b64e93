/**
 * The KV cache's counts as /health and /metrics show them (`EngineLike.kvStats`): the GPU pool
 * (full-precision and codec blocks, capacity), the session store's tiers and the tiers below the
 * GPU.
 */
import type { KvStats } from "../api/types.ts";
import { BLOCK } from "./kv/blocks.ts";
import type { KvPool } from "./kv/pool.ts";
import type { KvTiers } from "./kv/tiers.ts";
import type { Sessions } from "./sessions/sessions.ts";

/** What {@linkcode kvStatsOf} reads. */
export interface KvStatsParts {
  kv: KvPool;
  sessions: Sessions;
  /** Tokens each sequence keeps at full precision with a codec (`--kv-hot`). */
  kvHot: number;
  /** Blocks the re-encode pass has moved into codec blocks so far. */
  reencoded: number;
  tiers?: KvTiers;
}

/** The engine's {@linkcode KvStats}. */
export function kvStatsOf(p: KvStatsParts): KvStats {
  const snap = p.sessions.snapshotStats(), stored = p.sessions.storedBlocks();
  const kv = p.kv, pool = kv.blocks;
  const tokens = (pool.blocks.length - 1) * BLOCK;
  return {
    blockTokens: BLOCK,
    dtype: kv.dtype,
    gpu: { used: pool.usedCount, total: pool.hot - 1 },
    codec: kv.codec,
    hotTokens: kv.region ? p.kvHot : 0,
    codecBlocks: {
      used: pool.codecUsedCount,
      total: pool.blocks.length - pool.hot,
      reencoded: p.reencoded,
    },
    // Every block of the pool in use (hot and codec), per GB of its K and V buffers.
    capacity: { tokens, tokensPerGb: tokens / ((2 * kv.poolBytes) / 1e9) },
    // Blocks held by session snapshots in Deno KV (warm) and in files (cold); chunks shared by
    // sessions count once per session.
    kv: { used: stored.kv },
    fs: { used: stored.fs },
    snapshotBlocks: { copied: snap.blocksCopied, reused: snap.blocksReused },
    ...(p.tiers ? { tiers: p.tiers.stats() } : {}),
  };
}
