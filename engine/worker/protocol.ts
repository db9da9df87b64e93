/**
 * What crosses the thread boundary between the server's thread (engine/worker/host.ts) and the
 * engine's worker (engine/worker/worker.ts): the messages each way, and errors packed so that
 * the engine's error classes and their fields survive structured cloning.
 */
import type {
  Constraint,
  GenerationResult,
  KvStats,
  PrecisionStats,
  SamplingOptions,
  SessionInfo,
  SpeculationStats,
  TokenEvent,
} from "../../api/types.ts";
import {
  ContextLengthError,
  EngineBusyError,
  InvalidRequestError,
  SessionBusyError,
} from "../../api/errors.ts";
import type { DType, KvDtype, QuantizeMode } from "../../gpu/dtype.ts";
import type { EngineOptions } from "../engine.ts";

/** What the worker loads: a model folder, or a named shape with random weights (the bench). */
export type ModelSpec =
  | { dir: string }
  | {
    shape: string;
    dtype?: DType;
    tokenizerDir: string;
    /** Quantize the random projections (`--quantize`), keeping the float ones unless false. */
    quantize?: QuantizeMode;
    fallback?: boolean;
  };

/** Options of {@linkcode WorkerEngine.load}: the engine's, with the session store as a path. */
export interface WorkerEngineOptions extends Omit<EngineOptions, "gpu" | "store"> {
  /** Deno KV file the worker snapshots sessions into and restores them from (`--kv`). */
  kvPath?: string;
  /** The store's cold folder (`--kv-cold`; `SessionStoreOptions.coldDir`). */
  kvColdDir?: string;
  /** Packed bytes the store keeps in Deno KV (`--kv-warm-mb`; `SessionStoreOptions.warmBytes`). */
  kvWarmBytes?: number;
}

/** The engine's counters as of the worker's last message. */
export interface WorkerState {
  running: number;
  kv: KvStats;
  speculation: SpeculationStats;
  /** The layers' precision, when the model is quantized. */
  precision?: PrecisionStats;
}

/** What the worker reports once the model is loaded. */
export interface ReadyInfo {
  modelId: string;
  adapterName: string;
  contextLength: number;
  kvDtype: KvDtype;
  vocabSize: number;
  maxSlots: number;
  maxQueued: number;
  sessions: SessionInfo[];
  state: WorkerState;
}

/** An error as it crosses the thread boundary (class name, message and own fields). */
export interface WireError {
  name: string;
  message: string;
  stack?: string;
  fields: Record<string, unknown>;
}

/** Requests this thread can make of the worker beyond generating. */
export type CallMethod =
  | "deleteSession"
  | "flushSnapshots"
  | "hostStats"
  | "setSpeculation"
  | "registerConstraint"
  | "replaySession";

/** Messages to the worker. */
export type ToWorker =
  | { t: "init"; model: ModelSpec; options: WorkerEngineOptions }
  | {
    t: "generate";
    id: number;
    promptIds: number[];
    sampling: SamplingOptions;
    sessionId?: string;
    tenant?: string;
    speculation?: boolean;
    constraint?: Constraint;
  }
  | { t: "cancel"; id: number }
  | { t: "call"; rid: number; method: CallMethod; args: unknown[] }
  | { t: "close" };

/**
 * What one flush of the worker carries: tokens per generation in order, then the generations
 * that ended (after their tokens), the sessions whose info changed, and the counters.
 */
export interface Batch {
  t: "batch";
  tokens: [number, TokenEvent[]][];
  ends: [number, GenerationResult][];
  errors: [number, WireError][];
  sessions: [string, SessionInfo | null][];
  state: WorkerState;
}

/** Messages from the worker. */
export type FromWorker =
  | { t: "alive" }
  | { t: "ready"; info: ReadyInfo }
  | { t: "failed"; error: WireError }
  | Batch
  | { t: "reply"; rid: number; value?: unknown; error?: WireError }
  | { t: "closed" };

/** Packs an error for `postMessage` (structured clone keeps neither the class nor `code`). */
export function toWire(e: unknown): WireError {
  if (!(e instanceof Error)) return { name: "Error", message: String(e), fields: {} };
  const fields: Record<string, unknown> = {};
  for (const [k, v] of Object.entries(e)) {
    if (v === null || ["string", "number", "boolean", "bigint"].includes(typeof v)) fields[k] = v;
  }
  return { name: e.constructor.name, message: e.message, stack: e.stack, fields };
}

const ERROR_CLASSES: Record<string, { prototype: Error }> = {
  ContextLengthError,
  EngineBusyError,
  InvalidRequestError,
  SessionBusyError,
};

/** The error {@linkcode toWire} packed, of its engine class when it was one. */
export function fromWire(w: WireError): Error {
  const cls = ERROR_CLASSES[w.name];
  const e: Error = cls ? Object.create(cls.prototype) : new Error(w.message);
  Object.defineProperty(e, "message", { value: w.message, writable: true, configurable: true });
  if (w.stack) Object.defineProperty(e, "stack", { value: w.stack, configurable: true });
  if (!cls && w.name !== "Error") e.name = w.name;
  return Object.assign(e, w.fields);
}
