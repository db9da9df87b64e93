/**
 * strata's command line: `serve` runs the OpenAI-compatible server, `generate` runs one prompt.
 *
 *   deno task start [--model DIR] [--host H] [--port N] [--api-key KEY]... [--kv PATH]
 *                   [--kv-cold DIR] [--kv-warm-mb N] [--max-connections N] [--allowed-hosts H,...]
 *                   [--kv-host-mb N] [--kv-spill DIR] [--kv-spill-mb N]
 *   deno task generate [--model DIR] (--prompt TEXT | --prompt-ids 1,2,3) [--max-tokens N]
 *                      [--temperature T] [--seed S] [--json] [--kv-dtype f32|f16]
 *                      [--context-length N] [--quantize int8|e4m3|none]
 *                      [--kv-codec none|f16|int8|bfp4|sign1] [--kv-hot N]
 */
import { parseArgs } from "node:util";
import { SessionStore } from "./engine/sessions/store.ts";
import { Engine } from "./engine/engine.ts";
import { sampling } from "./api/types.ts";
import { status } from "./engine/model/progress.ts";
import { WorkerEngine } from "./engine/worker/host.ts";
import {
  below,
  codecOptions,
  hex,
  int,
  kvNote,
  list,
  num,
  quantizeOptions,
  quantNote,
  seconds,
  speculateFlag,
  tierFlags,
} from "./scripts/cli_flags.ts";
import { parseKvDtype } from "./gpu/dtype.ts";

/** The model served when none is given: the small model shipped in models/. */
export const DEFAULT_MODEL = new URL("./models/strata-default", import.meta.url).pathname;

const USAGE = `usage:
  main.ts serve    [--model DIR] [--host H] [--port N] [--api-key KEY]... [--kv PATH]
                   [--max-slots N] [--max-queued N] [--context-length N] [--cors ORIGINS]
                   [--allowed-hosts HOSTS] [--max-body-bytes N] [--max-connections N]
                   [--header-timeout S] [--idle-timeout S] [--body-timeout S]
                   [--kv-dtype f32|f16] [--kv-blocks N] [--kv-cold DIR] [--kv-warm-mb N]
                   [--kv-sync] [--speculate off|auto] [--quantize int8|e4m3|none]
                   [--quantize-fallback on|off] [--kv-host-mb N] [--kv-spill DIR]
                   [--kv-spill-mb N] [--kv-codec none|f16|int8|bfp4|sign1] [--kv-hot N]
  main.ts generate [--model DIR] (--prompt TEXT | --prompt-ids 1,2,3) [--max-tokens N]
                   [--temperature T] [--top-p P] [--top-k K] [--min-p P] [--seed S]
                   [--stop STR] [--chat] [--json] [--kv-dtype f32|f16] [--context-length N]
                   [--speculate off|auto] [--quantize int8|e4m3|none] [--quantize-fallback on|off]
                   [--kv-codec none|f16|int8|bfp4|sign1] [--kv-hot N]
  main.ts generate --replay SESSION --kv PATH [--model DIR] [--json]
--kv PATH keeps sessions (tokens and KV blocks) in Deno KV at PATH across restarts.
--kv-sync: a session's turn ends (its last SSE chunk, JSON response or WebSocket "done") only
once its snapshot is committed to the store, so an answered turn survives a crash; without it the
snapshot lands shortly after, and the response's session.persisted_at_ms is null.
--kv-warm-mb N: packed KV blocks Deno KV keeps (default 512); past that, the least recently
updated sessions' blocks move to files in --kv-cold DIR (default PATH.cold; for a remote KV URL,
none unless given: its blocks then all stay in it).
--speculate auto (default) drafts tokens from each sequence's own text and the model's own earlier
guesses and verifies them in one pass where that is faster (the tokens are exactly those of plain
decoding); off never does (docs/speculation.md).
generate --replay SESSION runs the session's recorded turns (its last 8) from the store at --kv
PATH again and compares tokens and fingerprints of the hidden states: it prints the first
divergence, and exits 1 when there is one (SESSION: the id a client sent; on a server with API
keys, TENANT/ID where TENANT is the key's tenant id).
--kv-dtype f16 holds the KV cache in half the memory (K and V rounded to f16); default f32.
--kv-blocks N sizes the GPU KV pool in 16-token blocks (default 4096 f32 blocks' worth of memory,
at most what one binding holds).
--kv-host-mb N: host memory for the KV of sessions evicted from the GPU (default 1024; 0: none):
their next turn brings it back instead of prefilling (its tokens count as cached). --kv-spill DIR
adds a folder of spill files (raw binary, one per block; its block files from an earlier run are
removed at start) that takes what host memory cannot hold, up to --kv-spill-mb N (default 16384).
A tier is used only when the start-up profile (in /health) measured it faster than recomputing;
a spill slower than 200 ms pauses spills for 30 s (docs/kv_tiers.md).
--kv-codec f16|int8|bfp4|sign1 keeps the newest --kv-hot N tokens of each sequence (default 128)
at full precision and re-encodes every older whole block on the GPU (f16 from an f32 cache; int8
with a scale per token; bfp4: 4-bit mantissas, an exponent per 16 values; sign1: a 1-bit sketch),
which attention reads as it is: more tokens in the same memory, at a measured cost in quality
(docs/kv_codecs.md). --kv-blocks then counts full-precision blocks, and the pool holds as many
bytes again of codec blocks (by default half the usual pool each). Default none.
--quantize int8|e4m3 quantizes every layer's projections (QKV, o, gate/up, down) at load, one
scale per output row; norms, attention, residuals, the KV cache, embeddings and the LM head keep
their precision. A monitor measures each layer's inputs every batch and runs a layer whose inputs
leave the safe range at its 16-bit weights (/metrics, /health); --quantize-fallback off frees
those weights' memory instead (layers then stay quantized). Default none. GGUF files with
quantized tensors (Q8_0, Q4_0, Q4_K, Q6_K) run in their own types without --quantize.
--api-key KEY, once per tenant: each key's sessions and prefix cache are its own.
--allowed-hosts: Host names the server answers to (default: the loopback names when --host is a
loopback address, else any; * for any). --cors ORIGINS also lets those pages open WebSockets.
--max-connections N (default 512), --header-timeout S (a new connection's request head, default
10), --idle-timeout S (a kept-alive connection's next request, default 30), --body-timeout S
(a request body, default 30).
Environment: STRATA_MODEL, HOST, PORT, STRATA_API_KEY, STRATA_API_KEYS (comma-separated),
STRATA_KV, STRATA_CORS, STRATA_ALLOWED_HOSTS, STRATA_MAX_SLOTS, STRATA_MAX_QUEUED,
STRATA_CONTEXT_LENGTH, STRATA_MAX_BODY_BYTES, STRATA_MAX_CONNECTIONS, STRATA_HEADER_TIMEOUT,
STRATA_IDLE_TIMEOUT, STRATA_BODY_TIMEOUT, STRATA_KV_DTYPE, STRATA_KV_BLOCKS, STRATA_KV_COLD,
STRATA_KV_WARM_MB, STRATA_KV_SYNC (1 or 0), STRATA_SPECULATE, STRATA_KV_HOST_MB, STRATA_KV_SPILL,
STRATA_KV_SPILL_MB, STRATA_KV_CODEC, STRATA_KV_HOT`;

async function generate(args: string[]): Promise<void> {
  const { values: v } = parseArgs({
    args,
    options: {
      model: { type: "string" },
      prompt: { type: "string" },
      "prompt-ids": { type: "string" },
      "max-tokens": { type: "string" },
      temperature: { type: "string" },
      "top-p": { type: "string" },
      "top-k": { type: "string" },
      "min-p": { type: "string" },
      seed: { type: "string" },
      stop: { type: "string", multiple: true },
      chat: { type: "boolean" },
      json: { type: "boolean" },
      "kv-dtype": { type: "string" },
      "kv-codec": { type: "string" },
      "kv-hot": { type: "string" },
      "context-length": { type: "string" },
      speculate: { type: "string" },
      quantize: { type: "string" },
      "quantize-fallback": { type: "string" },
      replay: { type: "string" },
      kv: { type: "string" },
      help: { type: "boolean" },
    },
  });
  if (v.help) return console.log(USAGE);
  if (v.replay !== undefined) return await replay(v.replay, v);
  if (v.kv !== undefined) throw new Error("--kv applies to generate with --replay");
  if ((v.prompt === undefined) === (v["prompt-ids"] === undefined)) {
    throw new Error("give exactly one of --prompt TEXT or --prompt-ids 1,2,3");
  }
  const engine = await Engine.load(v.model ?? Deno.env.get("STRATA_MODEL") ?? DEFAULT_MODEL, {
    maxSlots: 1,
    kvDtype: parseKvDtype(v["kv-dtype"] ?? (Deno.env.get("STRATA_KV_DTYPE") || undefined)),
    contextLength: v["context-length"] !== undefined
      ? int("context-length", v["context-length"], 0)
      : undefined,
    speculate: speculateFlag(v.speculate ?? (Deno.env.get("STRATA_SPECULATE") || undefined)),
    ...quantizeOptions(v.quantize, v["quantize-fallback"]),
    ...codecOptions(v["kv-codec"], v["kv-hot"]),
  });
  status(`model ${engine.modelId} on ${engine.adapterName}${quantNote(engine.weights.quant)}`);
  const promptIds = v["prompt-ids"] !== undefined
    ? v["prompt-ids"].split(",").map((s) => int("prompt-ids", s.trim(), 0))
    : v.chat
    ? engine.encodeChat([{ role: "user", content: v.prompt! }])
    : engine.encode(v.prompt!);
  const opts = sampling({
    temperature: num("temperature", v.temperature, 0),
    topP: num("top-p", v["top-p"], 1),
    topK: int("top-k", v["top-k"], 0),
    minP: num("min-p", v["min-p"], 0),
    seed: v.seed === undefined ? undefined : BigInt(v.seed),
    maxTokens: int("max-tokens", v["max-tokens"], 64),
    stop: v.stop ?? [],
  });
  const gen = engine.generate({ promptIds, sampling: opts });
  const tokens: number[] = [], logprobs: number[] = [];
  let text = "";
  const enc = new TextEncoder();
  if (!v.json) Deno.stdout.writeSync(enc.encode(v.prompt ?? ""));
  for await (const t of gen) {
    tokens.push(t.id);
    logprobs.push(t.logprob);
    text += t.text;
    if (!v.json) Deno.stdout.writeSync(enc.encode(t.text));
  }
  const r = await gen.result;
  if (v.json) {
    console.log(JSON.stringify({
      model: engine.modelId,
      adapter: engine.adapterName,
      prompt_ids: promptIds,
      tokens,
      logprobs,
      text,
      finish_reason: r.finishReason,
      seed: r.seed.toString(),
      ttft_ms: r.ttftMs,
      speculation: {
        steps: r.speculation?.steps ?? 0,
        drafted: r.speculation?.drafted ?? 0,
        accepted: r.speculation?.accepted ?? 0,
      },
    }));
  } else {
    console.log();
    status(`${tokens.length} tokens, finish_reason ${r.finishReason}`);
  }
}

/** `generate --replay SESSION --kv PATH`: the session's recorded turns again, compared. */
async function replay(
  id: string,
  v: { kv?: string; model?: string; json?: boolean; prompt?: string; "prompt-ids"?: string },
): Promise<void> {
  const kvPath = v.kv ?? (Deno.env.get("STRATA_KV") || undefined);
  if (!kvPath) throw new Error("--replay needs --kv PATH (the session store holding it)");
  if (v.prompt !== undefined || v["prompt-ids"] !== undefined) {
    throw new Error("--replay runs the session's own prompts: give no --prompt or --prompt-ids");
  }
  const store = await SessionStore.open(kvPath);
  try {
    const engine = await Engine.load(v.model ?? Deno.env.get("STRATA_MODEL") ?? DEFAULT_MODEL, {
      maxSlots: 1,
      store,
    });
    if (!engine.session(id)) throw new Error(`no session '${id}' in ${kvPath} for this model`);
    const r = await engine.replaySession(id);
    const d = r.divergence;
    if (v.json) console.log(JSON.stringify(r));
    else if (d) {
      console.log(
        `turn ${d.turn}, step ${d.step}: ${
          d.kind === "token" ? "a different token" : "another state"
        } ` +
          `(expected token ${d.expected.token}, fingerprint ${hex(d.expected.fingerprint)}; got ` +
          `${d.got.token}, ${hex(d.got.fingerprint)})`,
      );
    } else {
      console.log(
        `identical: ${r.turns} turns, ${r.tokens} tokens; fingerprints exact for ` +
          `${r.exactFingerprints}, at most ${r.maxDistance} bits apart` +
          (r.skipped.length
            ? `; skipped ${r.skipped.map((s) => `turn ${s.turn} (${s.reason})`).join(", ")}`
            : ""),
      );
    }
    if (d) Deno.exitCode = 1;
  } finally {
    store.close();
  }
}

async function serve(args: string[]): Promise<void> {
  const { values: v } = parseArgs({
    args,
    options: {
      model: { type: "string" },
      host: { type: "string" },
      port: { type: "string" },
      "api-key": { type: "string", multiple: true },
      cors: { type: "string" },
      "allowed-hosts": { type: "string" },
      "max-connections": { type: "string" },
      "header-timeout": { type: "string" },
      "idle-timeout": { type: "string" },
      "body-timeout": { type: "string" },
      "max-slots": { type: "string" },
      "max-queued": { type: "string" },
      "context-length": { type: "string" },
      "max-body-bytes": { type: "string" },
      kv: { type: "string" },
      "kv-dtype": { type: "string" },
      "kv-blocks": { type: "string" },
      "kv-cold": { type: "string" },
      "kv-warm-mb": { type: "string" },
      "kv-sync": { type: "boolean" },
      "kv-codec": { type: "string" },
      "kv-hot": { type: "string" },
      speculate: { type: "string" },
      quantize: { type: "string" },
      "quantize-fallback": { type: "string" },
      "kv-host-mb": { type: "string" },
      "kv-spill": { type: "string" },
      "kv-spill-mb": { type: "string" },
      help: { type: "boolean" },
    },
  });
  if (v.help) return console.log(USAGE);
  const quantize = quantizeOptions(v.quantize, v["quantize-fallback"]);
  const tiers = tierFlags(v, (k) => Deno.env.get(k) || undefined);
  const codec = codecOptions(v["kv-codec"], v["kv-hot"]);
  const env = (k: string) => Deno.env.get(k) || undefined;
  const kvPath = v.kv ?? env("STRATA_KV");
  const syncEnv = env("STRATA_KV_SYNC");
  if (syncEnv !== undefined && !["0", "1", "true", "false"].includes(syncEnv)) {
    throw new Error(`STRATA_KV_SYNC must be 1, 0, true or false; got '${syncEnv}'`);
  }
  const kvSync = v["kv-sync"] ?? (syncEnv === "1" || syncEnv === "true");
  if (kvSync && !kvPath) {
    throw new Error("--kv-sync needs --kv PATH (the session store it waits for)");
  }
  const kvCold = v["kv-cold"] ?? env("STRATA_KV_COLD");
  const warmArg = v["kv-warm-mb"] ?? env("STRATA_KV_WARM_MB");
  const warmMb = int("kv-warm-mb", warmArg, 512);
  if (warmMb < 0) throw new Error(`--kv-warm-mb must be >= 0; got ${warmMb}`);
  if (!kvPath && (kvCold !== undefined || warmArg !== undefined)) {
    throw new Error("--kv-cold and --kv-warm-mb need --kv PATH (the session store)");
  }
  // The server's flags are checked before the model loads, so a typo fails at once.
  const hostname = v.host ?? env("HOST") ?? "127.0.0.1";
  const port = int("port", v.port ?? env("PORT"), 8000);
  const maxConnections = int(
    "max-connections",
    v["max-connections"] ?? env("STRATA_MAX_CONNECTIONS"),
    512,
  );
  if (maxConnections < 1) throw new Error(`--max-connections must be >= 1; got ${maxConnections}`);
  const limits = {
    maxConnections,
    headerTimeoutMs: seconds(
      "header-timeout",
      v["header-timeout"] ?? env("STRATA_HEADER_TIMEOUT"),
      10,
    ),
    idleTimeoutMs: seconds("idle-timeout", v["idle-timeout"] ?? env("STRATA_IDLE_TIMEOUT"), 30),
  };
  const bodyTimeoutMs = seconds(
    "body-timeout",
    v["body-timeout"] ?? env("STRATA_BODY_TIMEOUT"),
    30,
  );
  const maxBodyBytes = int(
    "max-body-bytes",
    v["max-body-bytes"] ?? env("STRATA_MAX_BODY_BYTES"),
    1 << 20,
  );
  // Flags replace the environment's keys; STRATA_API_KEY (one key) joins STRATA_API_KEYS.
  const envKey = env("STRATA_API_KEY");
  const apiKeys = v["api-key"]?.length
    ? v["api-key"]
    : [...(list(env("STRATA_API_KEYS")) ?? []), ...(envKey ? [envKey] : [])];
  if (apiKeys.some((k) => k.trim() === "")) throw new Error("--api-key must not be empty");
  const { isLoopback, LOOPBACK_HOSTS } = await import("./routes/guard.ts");
  const allowedHosts = list(v["allowed-hosts"] ?? env("STRATA_ALLOWED_HOSTS")) ??
    (isLoopback(hostname) ? LOOPBACK_HOSTS : ["*"]);
  if (allowedHosts.length === 0) {
    throw new Error("--allowed-hosts must name at least one host name (or * for any)");
  }
  const model = v.model ?? env("STRATA_MODEL") ?? DEFAULT_MODEL;
  // The engine runs in a worker: its GPU waits block that thread, not the server's.
  const engine = await WorkerEngine.load({ dir: model }, {
    kvPath,
    kvColdDir: kvCold,
    kvWarmBytes: warmMb * 2 ** 20,
    kvSync,
    speculate: speculateFlag(v.speculate ?? env("STRATA_SPECULATE")),
    maxSlots: int("max-slots", v["max-slots"] ?? env("STRATA_MAX_SLOTS"), 16),
    maxQueued: int("max-queued", v["max-queued"] ?? env("STRATA_MAX_QUEUED"), 64),
    contextLength: v["context-length"] ?? env("STRATA_CONTEXT_LENGTH")
      ? int("context-length", v["context-length"] ?? env("STRATA_CONTEXT_LENGTH"), 0)
      : undefined,
    kvDtype: parseKvDtype(v["kv-dtype"] ?? env("STRATA_KV_DTYPE")),
    kvBlocks: v["kv-blocks"] ?? env("STRATA_KV_BLOCKS")
      ? int("kv-blocks", v["kv-blocks"] ?? env("STRATA_KV_BLOCKS"), 0)
      : undefined,
    ...quantize,
    ...tiers,
    ...codec,
  });
  const { createApp } = await import("./routes/app.ts");
  const { listen } = await import("./routes/listen.ts");
  const shutdown = new AbortController();
  const app = createApp(engine, {
    apiKeys,
    allowedHosts,
    corsOrigins: list(v.cors ?? env("STRATA_CORS")),
    maxBodyBytes,
    bodyTimeoutMs,
    shutdown: shutdown.signal,
  });
  const server = listen(app.fetch, {
    hostname,
    port,
    ...limits,
    onListen: ({ hostname, port }) =>
      console.error(
        `strata: serving ${engine.modelId} on ${engine.adapterName} at http://${hostname}:${port}/` +
          ` (KV cache: ${kvNote(engine.kvStats())}${below(engine.kvStats().tiers)}; ` +
          `${apiKeys.length} API key${apiKeys.length === 1 ? "" : "s"}` +
          `${quantize.quantize !== "none" ? `; ${quantize.quantize} projections` : ""})`,
      ),
  });
  // On SIGINT/SIGTERM: new requests get 503 while running ones finish, then exit. Once: a
  // terminal's Ctrl-C also reaches scripts/launch.ts, which passes it on.
  let draining = false;
  for (const sig of ["SIGINT", "SIGTERM"] as const) {
    Deno.addSignalListener(sig, () => {
      if (draining) return;
      draining = true;
      console.error(`strata: ${sig}, draining`);
      shutdown.abort();
      server.shutdown().then(() => engine.flushSnapshots()).then(() => engine.close())
        .then(() => Deno.exit(0));
    });
  }
}

if (import.meta.main) {
  const [command, ...rest] = Deno.args;
  try {
    if (command === "serve") await serve(rest);
    else if (command === "generate") await generate(rest);
    else {
      console.error(USAGE);
      Deno.exit(command === undefined || command === "help" || command === "--help" ? 0 : 2);
    }
  } catch (e) {
    // `deno task start` grants what the flags name (scripts/launch.ts); say how to get more.
    const hint = e instanceof Deno.errors.NotCapable
      ? " (deno task start and generate grant only what their flags name: pass the path or " +
        "host as a flag, or run deno run with the --allow-* flag above; see README, Permissions)"
      : "";
    console.error(`strata: ${e instanceof Error ? e.message : e}${hint}`);
    Deno.exit(1);
  }
}
