/** `GET /health`: liveness for load balancers, with the model, adapter, load and KV use. */
import { Hono } from "hono";
import type {
  KvTierStats,
  PrecisionStats,
  SpeculationStats,
  StorageTierProfile,
  TierRate,
  TierUse,
} from "../api/types.ts";
import type { ServerContext } from "./context.ts";

/**
 * Speculation's state as JSON: the mode, why it paused (the failure breaker says so until it is
 * switched on again), the share of drafts accepted, the drafts from the pool of guesses, the
 * cross-checks against the plain path, and each length group's counts and draft depth.
 */
export function speculationJson(s: SpeculationStats) {
  return {
    mode: s.mode,
    paused_because: s.pausedBecause ?? null,
    tripped: s.tripped ?? false,
    steps: s.steps,
    drafted: s.drafted,
    accepted: s.accepted,
    acceptance: s.drafted > 0 ? s.accepted / s.drafted : null,
    pooled: s.pooled ?? 0,
    pooled_accepted: s.pooledAccepted ?? 0,
    checks: s.checks ?? 0,
    check_failures: s.failures ?? 0,
    check_max_distance: s.maxDistance ?? 0,
    groups: (s.groups ?? []).map((g) => ({
      context: g.name,
      steps: g.steps,
      drafted: g.drafted,
      accepted: g.accepted,
      depth: g.depth,
    })),
  };
}

/**
 * `precision` for a quantized model: the mode, whether the 16-bit fallback is there (and why
 * not), the layers running at 16 bits now and the switches so far.
 */
function precision(p: PrecisionStats | undefined) {
  if (!p || p.mode === "none") return {};
  const why = p.mode === "gguf"
    ? "the GGUF file holds no 16-bit weights"
    : "16-bit weights not kept (--quantize-fallback off)";
  return {
    precision: {
      mode: p.mode,
      fallback: p.fallback,
      ...(p.fallback ? {} : { fallback_off: `${why}: layers out of range stay quantized` }),
      layers: p.layers.length,
      layers_16bit: p.layers.filter((l) => l.fellBack).length,
      fallbacks: p.fallbacks,
    },
  };
}

const rateJson = (r: TierRate | undefined) =>
  r ? { gb_per_s: r.gbPerS, latency_ms: r.latencyMs } : null;
const useJson = (u: TierUse | undefined) =>
  u ? { use: u.use, restore_ms_per_block: u.restoreMsPerBlock, reason: u.reason } : null;

/** The start-up profile of the tiers (docs/kv_tiers.md) in snake case. */
function profileJson(p: StorageTierProfile) {
  return {
    measured_at: new Date(p.measuredAt).toISOString(),
    measure_ms: p.measureMs,
    block_bytes: p.blockBytes,
    recompute_tokens_per_s: p.recomputeTokensPerS,
    recompute_ms_per_block: p.recomputeMsPerBlock,
    gpu_to_host: rateJson(p.gpuToHost),
    host_to_gpu: rateJson(p.hostToGpu),
    host_to_file: rateJson(p.hostToFile),
    file_to_host: rateJson(p.fileToHost),
    kv_write: rateJson(p.kvWrite),
    kv_read: rateJson(p.kvRead),
    restore_from: { host: useJson(p.host), file: useJson(p.file), kv: useJson(p.kv) },
    prefetch_blocks: p.prefetchBlocks,
  };
}

/**
 * The tiers below the GPU, when the engine has them: host memory and spill files (blocks, bytes,
 * budgets), the spill breaker (paused and why), what moved, and the start-up profile.
 */
function tiersJson(t: KvTierStats | undefined) {
  if (!t) return {};
  const size = (x: { blocks: number; bytes: number; budgetBytes: number }) => ({
    blocks: x.blocks,
    bytes: x.bytes,
    budget_bytes: x.budgetBytes,
  });
  return {
    host: { ...size(t.host), spare_bytes: t.host.spareBytes },
    ...(t.file ? { file: size(t.file) } : {}),
    spill: {
      paused: t.breaker.paused,
      paused_because: t.breaker.reason ?? null,
      breaker_trips: t.breaker.trips,
      evictions_dropped: t.breaker.skipped,
      spilled_blocks: t.spilled.blocks,
      written_blocks: t.written.blocks,
      dropped_blocks: t.dropped,
      restored_blocks: t.restored.host + t.restored.file + t.restored.kv,
      failed_blocks: t.failed,
    },
    profile: t.profile ? profileJson(t.profile) : null,
  };
}

/** The `/health` sub-app: 200 `{status: "ok", ...}`, or 503 `{status: "shutting_down"}`. */
export function healthRoutes(ctx: ServerContext): Hono {
  return new Hono().get("/", (c) => {
    const { engine } = ctx;
    const shuttingDown = ctx.shutdown?.aborted ?? false;
    const load = engine.occupancy();
    const kv = engine.kvStats();
    return c.json({
      status: shuttingDown ? "shutting_down" : "ok",
      model: engine.modelId,
      adapter: engine.adapterName,
      context_length: engine.contextLength,
      load: {
        running: load.running,
        queued: load.queued,
        max_running: load.maxRunning,
        max_queued: Math.min(load.maxQueued, ctx.maxQueued),
      },
      kv: {
        block_tokens: kv.blockTokens,
        dtype: kv.dtype,
        gpu: { used: kv.gpu.used, total: kv.gpu.total },
        codec: kv.codec,
        hot_tokens: kv.hotTokens,
        codec_blocks: { used: kv.codecBlocks.used, total: kv.codecBlocks.total },
        capacity_tokens: kv.capacity.tokens,
        tokens_per_gb: Math.round(kv.capacity.tokensPerGb),
        kv: { used: kv.kv.used },
        fs: { used: kv.fs.used },
        ...tiersJson(kv.tiers),
      },
      speculation: speculationJson(engine.speculationStats()),
      ...precision(engine.precisionStats?.()),
      uptime_s: Math.floor(Date.now() / 1000) - ctx.startedAt,
    }, shuttingDown ? 503 : 200);
  });
}
