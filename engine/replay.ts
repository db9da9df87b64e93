/**
 * Replays of a session's recorded turns (engine/sessions/table.ts TurnRecord): each turn runs
 * again from its whole prompt with the settings and seed it ran with, as a fresh request, and
 * its tokens and fingerprints are compared with the record. Sampling draws from a counter-based
 * RNG keyed by (seed, position), so a replay gives the same tokens; the fingerprints tell that
 * the states behind them agree too, within rounding (REPLAY_MAX_DISTANCE bits).
 */
import {
  type Constraint,
  type ConstraintSpec,
  type GenerateRequest,
  type Generation,
  REPLAY_MAX_DISTANCE,
  type ReplayReport,
} from "../api/types.ts";
import { fingerprintDistance } from "../kernels/fingerprint.ts";
import type { TurnRecord } from "./sessions/table.ts";

/** What a replay needs of an engine. */
export interface Replayer {
  generate(request: GenerateRequest): Generation;
  compileConstraint(spec: ConstraintSpec): Promise<Constraint>;
}

/** Replays `turns` of session `id` on `engine`, oldest first, stopping at the first divergence. */
export async function replayTurns(
  engine: Replayer,
  id: string,
  turns: readonly TurnRecord[],
): Promise<ReplayReport> {
  const report: ReplayReport = {
    session: id,
    turns: 0,
    tokens: 0,
    exactFingerprints: 0,
    maxDistance: 0,
    divergence: null,
    skipped: [],
  };
  for (const [t, turn] of turns.entries()) {
    if (turn.tokens.length === 0) {
      report.skipped.push({ turn: t, reason: "it generated no token" });
      continue;
    }
    const constraint = turn.constraint === undefined
      ? undefined
      : await engine.compileConstraint(JSON.parse(turn.constraint) as ConstraintSpec);
    const gen = engine.generate({
      promptIds: turn.prompt,
      sampling: {
        ...turn.sampling,
        seed: BigInt(turn.sampling.seed),
        maxTokens: turn.tokens.length,
      },
      ...(constraint ? { constraint } : {}),
    });
    const tokens: number[] = [];
    for await (const ev of gen) tokens.push(ev.id);
    const { fingerprints } = await gen.result;
    report.turns++;
    for (let i = 0; i < turn.tokens.length; i++) {
      const want = { token: turn.tokens[i], fingerprint: turn.fingerprints[i] ?? 0 };
      const got = { token: tokens[i] ?? -1, fingerprint: fingerprints[i] ?? 0 };
      report.tokens++;
      const d = fingerprintDistance(want.fingerprint, got.fingerprint);
      const kind = got.token !== want.token ? "token" : d > REPLAY_MAX_DISTANCE ? "state" : null;
      if (kind) {
        report.divergence = { turn: t, step: i, kind, expected: want, got };
        return report;
      }
      report.maxDistance = Math.max(report.maxDistance, d);
      if (d === 0) report.exactFingerprints++;
    }
  }
  return report;
}
