/**
 * `deno task start` and `deno task generate`: runs main.ts with the permissions its flags need
 * and no others, instead of `-A`. The model folder, the session store and the listen address
 * are flags known only at run time, so this small script (no imports but node:util, no npm
 * packages) reads them and starts `deno run` with exactly:
 *
 * - `--allow-read`: the repository (the code, the worker's module, the WGSL kernels, the chat
 *   page, the default model), the model folder, the Deno KV file, the cold folder and the spill
 *   folder;
 * - `--allow-write`: the Deno KV file and the cold folder (only with `--kv`), the spill folder
 *   (only with `--kv-spill`);
 * - `--allow-net`: the listen address, and 127.0.0.1 for the listener's loopback leg
 *   (routes/listen.ts), plus a remote Deno KV's host; none for `generate`;
 * - `--allow-env`: the variables main.ts reads (and `DENO_KV_ACCESS_TOKEN` for a remote KV).
 *
 * WebGPU needs no permission in Deno 2.9.6 (no `--allow-ffi`): wgpu is part of the runtime.
 * This script holds `--allow-run` (to start that one process) and forwards SIGINT and SIGTERM.
 *
 *   deno run --allow-run --allow-env=... scripts/launch.ts serve|generate [main.ts flags]
 */
import { parseArgs } from "node:util";

const ROOT = decodeURIComponent(new URL("..", import.meta.url).pathname).replace(/\/$/, "");

/** The environment variables `main.ts serve` reads. */
export const SERVE_ENV = [
  "HOST",
  "PORT",
  "STRATA_MODEL",
  "STRATA_API_KEY",
  "STRATA_API_KEYS",
  "STRATA_KV",
  "STRATA_KV_COLD",
  "STRATA_KV_WARM_MB",
  "STRATA_KV_SYNC",
  "STRATA_SPECULATE",
  "STRATA_KV_DTYPE",
  "STRATA_KV_BLOCKS",
  "STRATA_KV_CODEC",
  "STRATA_KV_HOT",
  "STRATA_CORS",
  "STRATA_ALLOWED_HOSTS",
  "STRATA_MAX_SLOTS",
  "STRATA_MAX_QUEUED",
  "STRATA_CONTEXT_LENGTH",
  "STRATA_MAX_BODY_BYTES",
  "STRATA_MAX_CONNECTIONS",
  "STRATA_HEADER_TIMEOUT",
  "STRATA_IDLE_TIMEOUT",
  "STRATA_BODY_TIMEOUT",
  "STRATA_KV_HOST_MB",
  "STRATA_KV_SPILL",
  "STRATA_KV_SPILL_MB",
  "XDG_RUNTIME_DIR",
];

/** The environment variables `main.ts generate` reads. */
export const GENERATE_ENV = [
  "STRATA_MODEL",
  "STRATA_KV_DTYPE",
  "STRATA_KV_CODEC",
  "STRATA_KV_HOT",
  "STRATA_SPECULATE",
  "XDG_RUNTIME_DIR",
];

/** A host as `--allow-net` wants it (IPv6 addresses in brackets). */
function netHost(host: string): string {
  return host.includes(":") && !host.startsWith("[") ? `[${host}]` : host;
}

/**
 * The `deno run` permission flags for `main.ts <command> <args>`.
 *
 * @param command "serve" or "generate"
 * @param args main.ts's flags after the command
 * @param env how to read an environment variable (main.ts's fallbacks for the flags)
 * @throws Error for another command
 * @example
 * permissions("serve", ["--kv", "s.sqlite"], (k) => Deno.env.get(k));
 * // ["--allow-read=<repo>,<model>,s.sqlite,s.sqlite.cold", "--allow-write=s.sqlite,...", ...]
 */
export function permissions(
  command: string,
  args: string[],
  env: (name: string) => string | undefined,
): string[] {
  if (command !== "serve" && command !== "generate") {
    throw new Error(`launch.ts runs "serve" or "generate"; got ${JSON.stringify(command)}`);
  }
  const { values: v } = parseArgs({
    args,
    strict: false,
    options: {
      model: { type: "string" },
      host: { type: "string" },
      port: { type: "string" },
      kv: { type: "string" },
      "kv-cold": { type: "string" },
      "kv-spill": { type: "string" },
    },
  });
  const get = (flag: string, name: string) => {
    const value = v[flag] ?? env(name);
    return typeof value === "string" && value !== "" ? value : undefined;
  };
  const read = [ROOT];
  const model = get("model", "STRATA_MODEL");
  if (model) read.push(model);
  if (command === "generate") {
    return ["--no-prompt", `--allow-read=${read.join(",")}`, `--allow-env=${GENERATE_ENV}`];
  }
  const names = [...SERVE_ENV];
  const write: string[] = [];
  const port = get("port", "PORT") ?? "8000";
  const host = netHost(get("host", "HOST") ?? "127.0.0.1");
  const net = [port === "0" ? host : `${host}:${port}`, "127.0.0.1"];
  const kv = get("kv", "STRATA_KV");
  if (kv && /^https?:\/\//.test(kv)) {
    net.push(new URL(kv).host);
    names.push("DENO_KV_ACCESS_TOKEN");
    const cold = get("kv-cold", "STRATA_KV_COLD");
    if (cold) read.push(cold), write.push(cold);
  } else if (kv) {
    const cold = get("kv-cold", "STRATA_KV_COLD") ?? `${kv}.cold`;
    read.push(kv, cold);
    write.push(kv, cold);
  }
  const spill = get("kv-spill", "STRATA_KV_SPILL");
  if (spill) read.push(spill), write.push(spill);
  return [
    "--no-prompt",
    `--allow-read=${read.join(",")}`,
    ...(write.length ? [`--allow-write=${write.join(",")}`] : []),
    `--allow-net=${[...new Set(net)].join(",")}`,
    `--allow-env=${names.join(",")}`,
  ];
}

if (import.meta.main) {
  const [command, ...args] = Deno.args;
  let flags: string[];
  try {
    flags = permissions(command, args, (k) => Deno.env.get(k));
  } catch (e) {
    console.error(`strata: ${(e as Error).message}`);
    Deno.exit(2);
  }
  const child = new Deno.Command(Deno.execPath(), {
    args: ["run", ...flags, `${ROOT}/main.ts`, command, ...args],
    stdin: "inherit",
    stdout: "inherit",
    stderr: "inherit",
  }).spawn();
  // A terminal's Ctrl-C reaches both processes; main.ts drains once however many arrive.
  for (const sig of ["SIGINT", "SIGTERM"] as const) {
    Deno.addSignalListener(sig, () => {
      try {
        child.kill(sig);
      } catch { /* it has exited */ }
    });
  }
  Deno.exit((await child.status).code);
}
