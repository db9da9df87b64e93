/**
 * An engine's tiers below the GPU (engine/kv/tiers.ts) built from its options, and their
 * start-up profile (engine/kv/profile.ts) measured with the engine's own prefill and store.
 */
import { encode } from "../gpu/dispatch.ts";
import { isCpuAdapter } from "../gpu/device.ts";
import type { KvDtype } from "../gpu/dtype.ts";
import { measureProfile } from "./kv/profile.ts";
import type { KvPool } from "./kv/pool.ts";
import { FileTier } from "./kv/tier_file.ts";
import { HostTier } from "./kv/tier_host.ts";
import { KvTiers } from "./kv/tiers.ts";
import type { Runner } from "./runner/runner.ts";
import type { SessionStore } from "./sessions/store.ts";
import { probeStore } from "./sessions/store_probe.ts";
import { checkTierOptions, type EngineOptions, SPILL_BYTES } from "./options.ts";

/** Prefill chunks timed together for the profile (after one that compiles and warms). */
const PREFILL_REPEATS = 2;
/** Prefill tokens the profile times on a CPU adapter, where a long chunk takes seconds. */
const CPU_PREFILL_TOKENS = 64;

/**
 * The spill folder `options` name, opened (its old block files removed); none when they name
 * none.
 *
 * @throws Error naming the flag whose value is out of range
 */
export async function openFileTier(options: EngineOptions): Promise<FileTier | undefined> {
  checkTierOptions(options);
  const dir = options.kvSpillDir;
  return dir === undefined
    ? undefined
    : await FileTier.open(dir, options.kvSpillBytes ?? SPILL_BYTES);
}

/**
 * The tiers `options` ask for over `pool`, with the spill folder `file` opened by
 * {@linkcode openFileTier}: none when they ask for neither host memory, a spill folder nor a
 * store.
 *
 * @throws Error naming the flag whose value is out of range; for a spill folder not opened
 */
export function buildTiers(
  pool: KvPool,
  options: EngineOptions,
  file: FileTier | undefined,
): KvTiers | undefined {
  checkTierOptions(options);
  const hostBytes = options.kvHostBytes ?? 0;
  if (options.kvSpillDir !== undefined && !file) {
    throw new Error("a spill folder (kvSpillDir) needs Engine.open or Engine.load");
  }
  if (hostBytes === 0 && !file && !options.store) return undefined;
  return new KvTiers(pool, {
    host: new HostTier(hostBytes),
    file,
    policy: options.kvTierPolicy,
    breaker: options.kvSpillLimitMs === undefined ? undefined : { limitMs: options.kvSpillLimitMs },
  });
}

/** The engine as {@linkcode profileTiers} measures with it. */
export interface ProfileParts {
  runner: Pick<Runner<never>, "profilePrefill">;
  opts: { maxChunk: number };
  contextLength: number;
  kvDtype: KvDtype;
}

/**
 * Measures `tiers`' profile (engine/kv/profile.ts) with the engine `p`'s prefill and `store`, and
 * keeps it on them. Only while the engine is idle and before its sessions are restored.
 */
export async function profileTiers(
  tiers: KvTiers,
  p: ProfileParts,
  store?: SessionStore,
): Promise<void> {
  const dev = tiers.pool.gpu.device;
  tiers.profile = await measureProfile(tiers, {
    prefill: async () => {
      const cpu = isCpuAdapter(tiers.pool.gpu);
      const tokens = Math.min(
        p.opts.maxChunk,
        p.contextLength,
        cpu ? CPU_PREFILL_TOKENS : Infinity,
      );
      const run = async (repeats: number) => {
        const dispatches = p.runner.profilePrefill(tokens);
        const enc = dev.createCommandEncoder(), pass = enc.beginComputePass();
        for (let r = 0; r < repeats; r++) encode(pass, dispatches);
        pass.end();
        const t = performance.now();
        dev.queue.submit([enc.finish()]);
        await dev.queue.onSubmittedWorkDone();
        return performance.now() - t;
      };
      await run(1); // compiles the chunk's pipelines
      const t = performance.now();
      await dev.queue.onSubmittedWorkDone();
      const wait = performance.now() - t;
      const ms = await run(PREFILL_REPEATS);
      return { tokens: tokens * PREFILL_REPEATS, ms: Math.max(1e-3, ms - wait) };
    },
    ...(store
      ? { store: (records) => probeStore(store, records, p.kvDtype === "f16" ? 2 : 4) }
      : {}),
  });
}
