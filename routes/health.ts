/** `GET /health`: liveness for load balancers, with the model, adapter, load and KV use. */
import { Hono } from "hono";
import type { PrecisionStats, SpeculationStats } from "../api/types.ts";
import type { ServerContext } from "./context.ts";

/** Speculation's state as JSON: the mode, why it paused, and the share of drafts accepted. */
export function speculationJson(s: SpeculationStats) {
  return {
    mode: s.mode,
    paused_because: s.pausedBecause ?? null,
    steps: s.steps,
    drafted: s.drafted,
    accepted: s.accepted,
    acceptance: s.drafted > 0 ? s.accepted / s.drafted : null,
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
      },
      speculation: speculationJson(engine.speculationStats()),
      ...precision(engine.precisionStats?.()),
      uptime_s: Math.floor(Date.now() / 1000) - ctx.startedAt,
    }, shuttingDown ? 503 : 200);
  });
}
