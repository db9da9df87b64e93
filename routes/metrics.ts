/**
 * The server's metrics and `GET /metrics` (Prometheus text format).
 *
 * | metric                                 | type      | labels                 |
 * | -------------------------------------- | --------- | ---------------------- |
 * | `strata_http_requests_total`           | counter   | route, method, status  |
 * | `strata_prompt_tokens_total`           | counter   |                        |
 * | `strata_prompt_tokens_cached_total`    | counter   |                        |
 * | `strata_generation_tokens_total`       | counter   |                        |
 * | `strata_generations_total`             | counter   | finish_reason          |
 * | `strata_time_to_first_token_seconds`   | histogram |                        |
 * | `strata_inter_token_latency_seconds`   | histogram |                        |
 * | `strata_requests_running`              | gauge     |                        |
 * | `strata_requests_queued`               | gauge     |                        |
 * | `strata_requests_max_running`          | gauge     |                        |
 * | `strata_kv_blocks`                     | gauge     | tier (gpu, host, file, kv, fs) |
 * | `strata_kv_tier_bytes`                 | gauge     | tier (host, file)      |
 * | `strata_kv_spill_blocks_total`         | counter   | to (host, file, dropped) |
 * | `strata_kv_restore_blocks_total`       | counter   | from (host, file, kv, failed) |
 * | `strata_kv_spill_breaker_trips_total`  | counter   |                        |
 * | `strata_kv_spill_paused`               | gauge     |                        |
 * | `strata_kv_gpu_blocks_capacity`        | gauge     |                        |
 * | `strata_snapshot_blocks_total`         | counter   | source (gpu, store)    |
 * | `strata_websocket_connections`         | gauge     |                        |
 * | `strata_layer_weight_bits`             | gauge     | layer, format          |
 * | `strata_layer_out_of_range_total`      | counter   | layer                  |
 * | `strata_precision_fallbacks_total`     | counter   | direction (to_16bit, back) |
 * | `strata_precision_batches_total`       | counter   |                        |
 * | `strata_speculation_tokens_total`      | counter   | kind (drafted, accepted, pooled, pooled_accepted) |
 * | `strata_speculation_steps_total`       | counter   |                        |
 * | `strata_speculation_mode`              | gauge     | mode (off, auto, on)   |
 * | `strata_speculation_checks_total`      | counter   | result (passed, failed) |
 * | `strata_speculation_tripped`           | gauge     |                        |
 * | `strata_speculation_group_tokens_total` | counter  | group, kind (drafted, accepted) |
 * | `strata_speculation_group_steps_total` | counter   | group                  |
 * | `strata_speculation_group_depth`       | gauge     | group                  |
 *
 * The precision series exist for quantized models only (`--quantize`, GGUF block types): each
 * layer's bits per weight now (16 after the monitor switched it to its 16-bit weights), how often
 * its inputs left the safe range, and the switches (docs/quantization.md). Speculation's series
 * (docs/speculation.md): drafts proposed and accepted (`pooled`, `pooled_accepted`: those from the
 * n-gram pool of guesses), cross-checks against the plain path, whether the failure breaker has
 * turned it off (its reason is in /health), and per length group (`group`: "<128", "128-511",
 * "512+") the counts and the draft depth it runs now.
 */
import { Hono } from "hono";
import type { EngineLike } from "../api/types.ts";
import { Counter, Gauge, Histogram, Registry } from "./prometheus.ts";

/** The metrics the routes update (one set per app). */
export interface ServerMetrics {
  registry: Registry;
  requests: Counter;
  promptTokens: Counter;
  cachedPromptTokens: Counter;
  generationTokens: Counter;
  generations: Counter;
  ttft: Histogram;
  interToken: Histogram;
  /** Open WebSocket connections (read by a gauge). */
  sockets: { open: number };
}

const TTFT_BUCKETS = [0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 20, 40];
const ITL_BUCKETS = [0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5];

/** Creates the metric set; gauges read `engine.occupancy()` and `engine.kvStats()` at scrape time. */
export function createMetrics(engine: EngineLike): ServerMetrics {
  const r = new Registry();
  const sockets = { open: 0 };
  const m: ServerMetrics = {
    registry: r,
    requests: r.add(
      new Counter("strata_http_requests_total", "HTTP requests by route and status."),
    ),
    promptTokens: r.add(
      new Counter(
        "strata_prompt_tokens_total",
        "Prompt tokens of the sequences started (a prompt counts once per choice).",
      ),
    ),
    cachedPromptTokens: r.add(
      new Counter("strata_prompt_tokens_cached_total", "Prompt tokens served from cached KV."),
    ),
    generationTokens: r.add(
      new Counter("strata_generation_tokens_total", "Tokens generated."),
    ),
    generations: r.add(
      new Counter("strata_generations_total", "Finished generations by finish reason."),
    ),
    ttft: r.add(
      new Histogram(
        "strata_time_to_first_token_seconds",
        "Time from admission to the first token, in seconds.",
        TTFT_BUCKETS,
      ),
    ),
    interToken: r.add(
      new Histogram(
        "strata_inter_token_latency_seconds",
        "Time between consecutive tokens of one sequence as the server sees them, in seconds.",
        ITL_BUCKETS,
      ),
    ),
    sockets,
  };
  const load = (key: "running" | "queued" | "maxRunning") => () => [
    { labels: {}, value: engine.occupancy()[key] },
  ];
  r.add(new Gauge("strata_requests_running", "Sequences in the running batch.", load("running")));
  r.add(new Gauge("strata_requests_queued", "Sequences waiting for admission.", load("queued")));
  r.add(new Gauge("strata_requests_max_running", "Batch capacity.", load("maxRunning")));
  r.add(
    new Gauge("strata_kv_blocks", "KV cache blocks in use per tier.", () => {
      const kv = engine.kvStats();
      return [
        { labels: { tier: "gpu" }, value: kv.gpu.used },
        ...(kv.tiers ? [{ labels: { tier: "host" }, value: kv.tiers.host.blocks }] : []),
        ...(kv.tiers?.file ? [{ labels: { tier: "file" }, value: kv.tiers.file.blocks }] : []),
        { labels: { tier: "kv" }, value: kv.kv.used },
        { labels: { tier: "fs" }, value: kv.fs.used },
      ];
    }),
  );
  tierMetrics(r, engine);
  r.add(
    new Gauge("strata_kv_gpu_blocks_capacity", "KV cache blocks the GPU pool holds.", () => [
      { labels: {}, value: engine.kvStats().gpu.total },
    ]),
  );
  r.add(
    new Counter(
      "strata_snapshot_blocks_total",
      "KV blocks session snapshots copied from the GPU, or reused from an earlier snapshot.",
      () => {
        const s = engine.kvStats().snapshotBlocks;
        return [
          { labels: { source: "gpu" }, value: s.copied },
          { labels: { source: "store" }, value: s.reused },
        ];
      },
    ),
  );
  r.add(
    new Counter(
      "strata_speculation_tokens_total",
      "Speculative decoding: drafts proposed and drafts accepted (tokens a step gave beyond its own).",
      () => {
        const s = engine.speculationStats();
        return [
          { labels: { kind: "drafted" }, value: s.drafted },
          { labels: { kind: "accepted" }, value: s.accepted },
          { labels: { kind: "pooled" }, value: s.pooled ?? 0 },
          { labels: { kind: "pooled_accepted" }, value: s.pooledAccepted ?? 0 },
        ];
      },
    ),
  );
  r.add(
    new Counter(
      "strata_speculation_steps_total",
      "Verification steps, one per sequence per pass.",
      () => [
        { labels: {}, value: engine.speculationStats().steps },
      ],
    ),
  );
  r.add(
    new Gauge(
      "strata_speculation_mode",
      "1 for the speculation mode in force (off, auto, on).",
      () => {
        const mode = engine.speculationStats().mode;
        return (["off", "auto", "on"] as const).map((m) => ({
          labels: { mode: m },
          value: m === mode ? 1 : 0,
        }));
      },
    ),
  );
  speculationGroups(r, engine);
  r.add(
    new Gauge("strata_websocket_connections", "Open WebSocket connections.", () => [
      { labels: {}, value: sockets.open },
    ]),
  );
  const precision = () => engine.precisionStats?.();
  r.add(
    new Gauge(
      "strata_layer_weight_bits",
      "Bits per weight of each layer's projections now (16: fell back to its 16-bit weights).",
      () =>
        precision()?.layers.map((l, i) => ({
          labels: { layer: String(i), format: l.format },
          value: l.bits,
        })) ?? [],
    ),
  );
  r.add(
    new Counter(
      "strata_layer_out_of_range_total",
      "Batches in which a layer's measured inputs left the precision monitor's safe range.",
      () =>
        precision()?.layers.map((l, i) => ({
          labels: { layer: String(i) },
          value: l.outOfRange,
        })) ??
          [],
    ),
  );
  r.add(
    new Counter(
      "strata_precision_fallbacks_total",
      "Layers the precision monitor switched to their 16-bit weights, and back.",
      () => {
        const p = precision();
        return p
          ? [
            { labels: { direction: "to_16bit" }, value: p.fallbacks },
            { labels: { direction: "back" }, value: p.recoveries },
          ]
          : [];
      },
    ),
  );
  r.add(
    new Counter("strata_precision_batches_total", "Batches the precision monitor measured.", () => {
      const p = precision();
      return p ? [{ labels: {}, value: p.observations }] : [];
    }),
  );
  return m;
}

/**
 * The tiers below the GPU (docs/kv_tiers.md): bytes held, blocks moved, the spill breaker. No
 * series for an engine without tiers.
 */
function tierMetrics(r: Registry, engine: EngineLike): void {
  const tiers = () => engine.kvStats().tiers;
  r.add(
    new Gauge("strata_kv_tier_bytes", "Bytes of KV blocks held below the GPU, per tier.", () => {
      const t = tiers();
      if (!t) return [];
      return [
        { labels: { tier: "host" }, value: t.host.bytes },
        ...(t.file ? [{ labels: { tier: "file" }, value: t.file.bytes }] : []),
      ];
    }),
  );
  r.add(
    new Counter(
      "strata_kv_spill_blocks_total",
      "KV blocks of evicted sessions copied from the GPU to host memory, written from host " +
        "memory to files, or dropped from every tier.",
      () => {
        const t = tiers();
        return t
          ? [
            { labels: { to: "host" }, value: t.spilled.blocks },
            { labels: { to: "file" }, value: t.written.blocks },
            { labels: { to: "dropped" }, value: t.dropped },
          ]
          : [];
      },
    ),
  );
  r.add(
    new Counter(
      "strata_kv_restore_blocks_total",
      "KV blocks brought back onto the GPU by the tier they came from; failed: unreadable, " +
        "prefilled instead.",
      () => {
        const t = tiers();
        return t
          ? [
            { labels: { from: "host" }, value: t.restored.host },
            { labels: { from: "file" }, value: t.restored.file },
            { labels: { from: "kv" }, value: t.restored.kv },
            { labels: { from: "failed" }, value: t.failed },
          ]
          : [];
      },
    ),
  );
  r.add(
    new Counter(
      "strata_kv_spill_breaker_trips_total",
      "Spills slower than the limit (200 ms), each pausing spills.",
      () => {
        const t = tiers();
        return t ? [{ labels: {}, value: t.breaker.trips }] : [];
      },
    ),
  );
  r.add(
    new Gauge("strata_kv_spill_paused", "1 while spills are paused by the breaker.", () => {
      const t = tiers();
      return t ? [{ labels: {}, value: t.breaker.paused ? 1 : 0 }] : [];
    }),
  );
}

/** `GET /metrics`: the registry in Prometheus text format. */
export function metricsRoutes(metrics: ServerMetrics): Hono {
  return new Hono().get("/", (c) =>
    c.body(metrics.registry.render(), 200, {
      "Content-Type": "text/plain; version=0.0.4; charset=utf-8",
    }));
}

/** Speculation's cross-checks, its breaker and its length groups (see the module doc). */
function speculationGroups(r: Registry, engine: EngineLike): void {
  const stats = () => engine.speculationStats();
  const groups = () => stats().groups ?? [];
  r.add(
    new Counter(
      "strata_speculation_checks_total",
      "Verification steps cross-checked against the plain path, by result.",
      () => [
        { labels: { result: "passed" }, value: (stats().checks ?? 0) - (stats().failures ?? 0) },
        { labels: { result: "failed" }, value: stats().failures ?? 0 },
      ],
    ),
  );
  r.add(
    new Gauge(
      "strata_speculation_tripped",
      "1 while failed cross-checks keep speculation off (the reason: /health).",
      () => [{ labels: {}, value: stats().tripped ? 1 : 0 }],
    ),
  );
  r.add(
    new Counter(
      "strata_speculation_group_tokens_total",
      "Drafts proposed and accepted, by the length group of the sequence's context.",
      () =>
        groups().flatMap((g) => [
          { labels: { group: g.name, kind: "drafted" }, value: g.drafted },
          { labels: { group: g.name, kind: "accepted" }, value: g.accepted },
        ]),
    ),
  );
  r.add(
    new Counter(
      "strata_speculation_group_steps_total",
      "Verification steps by the length group of the sequence's context.",
      () => groups().map((g) => ({ labels: { group: g.name }, value: g.steps })),
    ),
  );
  r.add(
    new Gauge(
      "strata_speculation_group_depth",
      "Draft depth each length group runs now (0: it does not speculate now).",
      () => groups().map((g) => ({ labels: { group: g.name }, value: g.depth })),
    ),
  );
}
