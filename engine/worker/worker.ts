/// <reference lib="deno.worker" />
/**
 * The worker that hosts the engine for engine/worker/host.ts. It loads the model (or a named
 * shape with random weights), restores sessions from the store, then runs every generation it
 * is sent and reports back in batches: all tokens the engine hands out in one go (a readback
 * round's submission) leave in one message, flushed at the end of the microtask that produced
 * them, with the session infos that changed and the load and KV counters.
 */
import type { Generation, GenerationResult, SessionInfo, TokenEvent } from "../../api/types.ts";
import { Engine } from "../engine.ts";
import { getGpu } from "../../gpu/device.ts";
import { SessionStore } from "../sessions/store.ts";
import { syntheticModel } from "../model/synthetic.ts";
import {
  type Batch,
  type FromWorker,
  type ModelSpec,
  toWire,
  type ToWorker,
  type WireError,
  type WorkerEngineOptions,
  type WorkerState,
} from "./protocol.ts";

let engine: Engine | undefined;
const gens = new Map<number, Generation>();
let tokens = new Map<number, TokenEvent[]>();
let ends: [number, GenerationResult][] = [];
let errors: [number, WireError][] = [];
let changed = new Set<string>();
let scheduled = false;

function post(m: FromWorker): void {
  self.postMessage(m);
}

function state(e: Engine): WorkerState {
  const precision = e.weights.quant.mode === "none" ? undefined : e.precisionStats();
  return {
    running: e.occupancy().running,
    kv: e.kvStats(),
    speculation: e.speculationStats(),
    precision,
  };
}

/** Sends what piled up at the end of the current microtask. */
function schedule(): void {
  if (scheduled) return;
  scheduled = true;
  queueMicrotask(flush);
}

function flush(): void {
  scheduled = false;
  const e = engine!;
  const sessions: [string, SessionInfo | null][] = [...changed].map((id) => {
    const info = e.session(id);
    return [id, info ? { ...info } : null];
  });
  const batch: Batch = { t: "batch", tokens: [...tokens], ends, errors, sessions, state: state(e) };
  tokens = new Map();
  ends = [];
  errors = [];
  changed = new Set();
  post(batch);
}

let store: SessionStore | undefined;

async function init(model: ModelSpec, options: WorkerEngineOptions): Promise<Engine> {
  const { kvPath, kvColdDir, kvWarmBytes, ...rest } = options;
  store = kvPath
    ? await SessionStore.open(kvPath, { coldDir: kvColdDir, warmBytes: kvWarmBytes })
    : undefined;
  if ("dir" in model) return await Engine.load(model.dir, { ...rest, store });
  const gpu = await getGpu();
  const m = await syntheticModel(gpu, model.shape, {
    dtype: model.dtype,
    tokenizerDir: model.tokenizerDir,
    quantize: model.quantize,
    fallback: model.fallback,
  });
  return await Engine.open(gpu, m, { ...rest, gpu, store });
}

function generate(e: Engine, m: Extract<ToWorker, { t: "generate" }>): void {
  const { id } = m;
  let gen: Generation;
  try {
    gen = e.generate(
      {
        promptIds: m.promptIds,
        sampling: m.sampling,
        sessionId: m.sessionId,
        tenant: m.tenant,
        speculation: m.speculation,
        constraint: m.constraint,
      },
      (ev) => {
        const list = tokens.get(id);
        if (list) list.push(ev);
        else tokens.set(id, [ev]);
        schedule();
      },
    );
  } catch (err) {
    errors.push([id, toWire(err)]);
    return schedule();
  }
  gens.set(id, gen);
  gen.result.then(
    (r) => ends.push([id, r]),
    (err) => errors.push([id, toWire(err)]),
  ).finally(() => {
    gens.delete(id);
    schedule();
  });
}

async function call(e: Engine, m: Extract<ToWorker, { t: "call" }>): Promise<void> {
  try {
    const value = m.method === "deleteSession"
      ? await e.deleteSession(m.args[0] as string)
      : m.method === "flushSnapshots"
      ? await e.flushSnapshots()
      : m.method === "setSpeculation"
      ? await e.setSpeculation(m.args[0] as "off" | "auto")
      : m.method === "replaySession"
      ? await e.replaySession(m.args[0] as string)
      : m.method === "registerConstraint"
      ? e.registerConstraint(m.args[0] as string, m.args[1] as Uint32Array)
      : e.hostStats();
    // The mirror forgets the session, or sees the new mode, before the reply lands.
    if (m.method === "deleteSession" || m.method === "setSpeculation") flush();
    post({ t: "reply", rid: m.rid, value });
  } catch (err) {
    post({ t: "reply", rid: m.rid, error: toWire(err) });
  }
}

self.onmessage = async (ev: MessageEvent<ToWorker>) => {
  const m = ev.data;
  if (m.t === "init") {
    try {
      const e = engine = await init(m.model, m.options);
      e.onSessionChange = (id) => {
        changed.add(id);
        schedule();
      };
      // The store moves and deletes chunks between turns too: report the tiers' new counts.
      if (store) store.onTiersChange = schedule;
      const cfg = e.config;
      post({
        t: "ready",
        info: {
          modelId: e.modelId,
          adapterName: e.adapterName,
          contextLength: e.contextLength,
          kvDtype: e.kvDtype,
          vocabSize: cfg.vocabSize,
          maxSlots: e.opts.maxSlots,
          maxQueued: e.opts.maxQueued,
          sessions: e.sessions().map((s) => ({ ...s })),
          state: state(e),
        },
      });
    } catch (err) {
      post({ t: "failed", error: toWire(err) });
    }
    return;
  }
  if (m.t === "close") {
    // Generations still running are abandoned; the device goes with this thread, not at exit.
    for (const g of gens.values()) g.cancel();
    store?.close();
    engine?.gpu.device.destroy();
    post({ t: "closed" });
    return self.close();
  }
  const e = engine;
  if (!e) return;
  if (m.t === "generate") generate(e, m);
  else if (m.t === "cancel") gens.get(m.id)?.cancel();
  else if (m.t === "call") await call(e, m);
};
post({ t: "alive" });
