/**
 * The scheduler's policy without a GPU: admission into slots, the hold-back of a burst's
 * prefills behind running streams, eviction of idle sessions, the deadlock breaker, the decode
 * ramp and when a held submission goes on the GPU. Real sequences, block pool and session table
 * (all GPU-free bookkeeping); the tokenizer is a random test model's.
 */
import assert from "node:assert/strict";
import { sampling } from "../api/types.ts";
import { EngineBusyError } from "../api/errors.ts";
import { BLOCK, BlockPool, SequenceBlocks } from "../engine/kv/blocks.ts";
import { loadModelFolder } from "../engine/model/folder.ts";
import { TextTokenizer } from "../engine/model/tokenizer.ts";
import {
  type Admission,
  AFFINITY_WINDOW,
  MAX_BYPASS,
  MAX_INFLIGHT,
  poolBudget,
  Scheduler,
  type SchedulerOptions,
  STREAMING_STEPS,
} from "../engine/sched/scheduler.ts";
import { RestorePlan } from "../engine/kv/restore.ts";
import { blockHash } from "../engine/kv/blocks.ts";
import { promptSimhash } from "../engine/kv/simhash.ts";
import { Sequence } from "../engine/sched/sequence.ts";
import { SessionTable } from "../engine/sessions/table.ts";
import { makeTestModel } from "../scripts/make_test_model.ts";

const dir = await Deno.makeTempDir({ prefix: "strata_sched_" });
globalThis.addEventListener("unload", () => Deno.removeSync(dir, { recursive: true }));
await makeTestModel(dir, { arch: "llama" });
const tokenizer = TextTokenizer.load(await loadModelFolder(dir));

const OPTS: SchedulerOptions = {
  maxSlots: 2,
  maxQueued: 3,
  maxChunk: 64,
  maxSteps: 8,
  queueDepth: 2,
};

/** A scheduler over a pool of `blocks` blocks (block 0 is the trash block). */
function setup(blocks: number, opts: Partial<SchedulerOptions> = {}) {
  const pool = new BlockPool(blocks);
  const table = new SessionTable(pool);
  const sched = new Scheduler({ ...OPTS, ...opts });
  return { pool, table, sched, kv: poolBudget(pool, table) };
}

/** A sequence of a `prompt`-token prompt that may generate `maxTokens`. */
function seq(
  pool: BlockPool,
  prompt: number | number[],
  maxTokens: number,
  first = 1,
  restore?: RestorePlan,
): Sequence {
  const promptIds = typeof prompt === "number"
    ? Array.from({ length: prompt }, (_, i) => first + i)
    : prompt;
  const blocks = new SequenceBlocks(pool);
  const cached = blocks.appendPrompt(promptIds);
  return new Sequence({
    request: { promptIds, sampling: sampling({ maxTokens }) },
    blocks,
    cached,
    tokenizer,
    cancel: () => {},
    restore,
  });
}

/** An idle session `id` holding the KV of `ids` (whole blocks) on the GPU. */
function idleSession(s: ReturnType<typeof setup>, id: string, ids: number[], simhash?: bigint) {
  const blocks = new SequenceBlocks(s.pool);
  blocks.appendPrompt(ids);
  blocks.reserve(ids.length);
  blocks.markComputed(ids.length);
  const entry = s.table.create(id, blocks);
  entry.busy = false;
  entry.simhash = simhash;
  return entry;
}

const idle = { prefillQueued: 0, inflight: 0 };

/** Every admission decision until the scheduler has none. */
function admitAll(
  s: ReturnType<typeof setup>,
  gpu = idle,
): Admission[] {
  const out: Admission[] = [];
  for (let a; (a = s.sched.nextAdmission(gpu, s.kv));) out.push(a);
  return out;
}

Deno.test("scheduler: admits into free slots in order, reserving prompt + max tokens", () => {
  const s = setup(64);
  const [a, b, c] = [seq(s.pool, 20, 12), seq(s.pool, 5, 3), seq(s.pool, 7, 1)];
  for (const q of [a, b, c]) s.sched.enqueue(q);
  assert.equal(s.sched.queued, 3);
  const got = admitAll(s);
  assert.deepEqual(got.map((x) => [x.kind, x.seq]), [["admit", a], ["admit", b]]);
  assert.deepEqual([a.slot, b.slot, c.slot], [0, 1, -1]);
  assert.equal(a.blocks.table.length, Math.ceil(32 / BLOCK));
  assert.equal(b.blocks.table.length, 1);
  assert.deepEqual([s.sched.running, s.sched.queued], [2, 1]);
  // A slot frees: the next one takes it.
  assert.equal(s.sched.vacate(a), true);
  assert.equal(s.sched.vacate(a), false);
  assert.deepEqual(admitAll(s).map((x) => [x.kind, x.seq.slot]), [["admit", 0]]);
});

Deno.test("scheduler: a full queue refuses with EngineBusyError", () => {
  const s = setup(64);
  for (let i = 0; i < OPTS.maxQueued; i++) s.sched.enqueue(seq(s.pool, 3, 2));
  assert.throws(() => s.sched.checkRoom(), EngineBusyError);
  admitAll(s);
  s.sched.checkRoom(); // two went into slots
});

Deno.test("scheduler: a sequence cancelled while it waited is released, not admitted", () => {
  const s = setup(64);
  const a = seq(s.pool, 3, 2), b = seq(s.pool, 3, 2);
  s.sched.enqueue(a);
  s.sched.enqueue(b);
  a.cancel();
  assert.deepEqual(admitAll(s).map((x) => [x.kind, x.seq]), [["release", a], ["admit", b]]);
  assert.equal(b.slot, 0);
});

Deno.test("scheduler: while streams run, a burst's prefills are held to a chunk per round", () => {
  const s = setup(256, { maxSlots: 4 });
  const running = seq(s.pool, 3, 100);
  s.sched.enqueue(running);
  admitAll(s);
  const [a, b] = [seq(s.pool, 40, 4, 100), seq(s.pool, 40, 4, 200)];
  s.sched.enqueue(a);
  s.sched.enqueue(b);
  // The running sequence is still in its first steps: the burst is admitted whole.
  running.stepsSubmitted = STREAMING_STEPS;
  const burst = { prefillQueued: 40, inflight: 1 };
  assert.equal(s.sched.nextAdmission({ prefillQueued: 0, inflight: 1 }, s.kv)?.seq, a);
  assert.equal(s.sched.nextAdmission(burst, s.kv)?.seq, b);
  // Past that, 40 queued + 40 more would exceed the 64-token chunk: the third waits…
  running.stepsSubmitted = STREAMING_STEPS + 1;
  const c = seq(s.pool, 40, 4, 300);
  s.sched.enqueue(c);
  assert.equal(s.sched.nextAdmission(burst, s.kv), undefined);
  // …until the round's readback, and a prompt longer than a chunk still goes alone.
  assert.equal(s.sched.nextAdmission({ prefillQueued: 0, inflight: 0 }, s.kv)?.seq, c);
});

Deno.test("scheduler: a short pool evicts idle sessions, least recently used first", () => {
  const s = setup(1 + 6);
  // Two idle sessions hold 2 blocks each; the newer one was used last.
  for (const [id, t] of [["old", 1], ["new", 2]] as const) {
    const blocks = new SequenceBlocks(s.pool);
    blocks.appendPrompt(Array.from({ length: 2 * BLOCK }, (_, i) => 500 * t + i));
    blocks.reserve(2 * BLOCK);
    blocks.markComputed(2 * BLOCK);
    const entry = s.table.create(id, blocks);
    entry.busy = false;
    entry.info.updatedAt = t;
  }
  assert.equal(s.pool.freeCount, 2);
  const a = seq(s.pool, 40, 8); // 3 blocks
  s.sched.enqueue(a);
  assert.equal(admitAll(s)[0]?.kind, "admit");
  assert.equal(s.table.get("old")!.blocks.table.length, 0);
  assert.equal(s.table.get("new")!.blocks.table.length, 2);
});

Deno.test("scheduler: short of blocks, it waits while anything runs", () => {
  const s = setup(1 + 4);
  const a = seq(s.pool, 40, 8), b = seq(s.pool, 40, 8); // 3 blocks each
  s.sched.enqueue(a);
  s.sched.enqueue(b);
  assert.deepEqual(admitAll(s).map((x) => x.seq), [a]);
  assert.deepEqual(admitAll(s), []); // a runs: it will give blocks back
  s.sched.vacate(a);
  assert.deepEqual(admitAll(s, { prefillQueued: 0, inflight: 1 }), []); // its work in flight
  assert.equal(b.blocks.table.length, 0); // b was not failed or robbed meanwhile
  a.blocks.free();
  assert.deepEqual(admitAll(s).map((x) => x.seq), [b]);
});

Deno.test("scheduler: with nothing running, waiting sequences give up their KV, newest first", () => {
  const s = setup(1 + 4);
  // Three waiting turns each hold 1 cached block (their sessions' prefixes); the head needs 3.
  const held = [seq(s.pool, 30, 18, 1), seq(s.pool, 17, 2, 40), seq(s.pool, 17, 2, 80)];
  for (const q of held) {
    q.blocks.reserve(BLOCK);
    q.blocks.markComputed(BLOCK);
    s.sched.enqueue(q);
  }
  assert.equal(s.pool.freeCount, 1);
  const got = admitAll(s);
  assert.deepEqual(got.map((x) => [x.kind, x.seq]), [["admit", held[0]]]);
  // The newest gave its block back; the middle one kept its own.
  assert.equal(held[2].blocks.table.length, 0);
  assert.equal(held[1].blocks.table.length, 1);
});

Deno.test("scheduler: a sequence the pool can never hold fails with a message", () => {
  const s = setup(1 + 2);
  const big = seq(s.pool, 40, 10); // 4 blocks of a 2-block pool
  s.sched.enqueue(big);
  const [got] = admitAll(s);
  assert.equal(got.kind, "fail");
  assert.match(
    (got as Extract<Admission, { kind: "fail" }>).error.message,
    /internal error: the KV pool cannot hold 50 tokens/,
  );
  assert.equal(s.sched.queued, 0);
});

Deno.test("scheduler: decode submissions ramp 1, 2, 4 … maxSteps, capped by what is left", () => {
  const s = setup(64);
  const a = seq(s.pool, 3, 40), b = seq(s.pool, 3, 5);
  s.sched.enqueue(a);
  admitAll(s);
  const ramp: number[] = [];
  for (let i = 0; i < 5; i++) {
    const k = s.sched.decodeSteps(s.sched.live());
    ramp.push(k);
    a.stepsSubmitted += k;
    s.sched.submitted();
  }
  assert.deepEqual(ramp, [1, 2, 4, 8, 8]);
  // An admission starts the ramp again; the batch's longest remaining bounds it.
  s.sched.enqueue(b);
  admitAll(s);
  a.stepsSubmitted = 38;
  b.stepsSubmitted = 1;
  s.sched.submitted();
  s.sched.submitted();
  s.sched.submitted();
  assert.equal(s.sched.decodeSteps(s.sched.live()), 4); // b has 4 left, a 2
  a.gpuDone = true;
  assert.deepEqual(s.sched.live(), [undefined, b]);
  assert.equal(s.sched.hasLive(), true);
  b.gpuDone = true;
  assert.equal(s.sched.hasLive(), false);
});

Deno.test("scheduler: when a held decode submission goes on the GPU before a readback", () => {
  const { sched } = setup(64);
  const decode = (steps: number) => ({ steps });
  assert.equal(sched.submitNow([]), true);
  // Fewer than (queueDepth − 1) · maxSteps = 8 steps queued: submit.
  assert.equal(sched.submitNow([decode(1), decode(2), decode(4)]), true);
  assert.equal(sched.submitNow([decode(8)]), false);
  assert.equal(sched.submitNow(Array.from({ length: MAX_INFLIGHT }, () => decode(1))), false);
  // Never behind a prefill that samples a first token; a middle chunk does not count.
  assert.equal(sched.submitNow([{ steps: 1, prefill: true }]), false);
  assert.equal(sched.submitNow([{ steps: 0, prefill: true }]), true);
});

Deno.test("scheduler: drain empties the queue and the slots", () => {
  const s = setup(64, { maxSlots: 1 });
  const a = seq(s.pool, 3, 2), b = seq(s.pool, 3, 2);
  s.sched.enqueue(a);
  s.sched.enqueue(b);
  admitAll(s);
  assert.deepEqual(new Set(s.sched.drain()), new Set([a, b]));
  assert.deepEqual([s.sched.running, s.sched.queued], [0, 0]);
});

Deno.test("scheduler: a prompt that shares KV with an idle session goes before one that would evict it", () => {
  const s = setup(1 + 6, { maxSlots: 1 });
  // A document the idle session read, and a question about it queued behind an unrelated head.
  const doc = Array.from({ length: 2 * BLOCK }, (_, i) => 100 + ((i * 37) % 300));
  const question = [...doc, ...Array.from({ length: 3 }, (_, i) => 900 + i)];
  const entry = idleSession(s, "doc", doc, promptSimhash(question));
  const asked = seq(s.pool, question, 4); // finds the session's two blocks: needs one more
  const head = seq(s.pool, 60, 8, 1000); // 5 blocks: only evicting the session makes room
  s.sched.enqueue(head);
  s.sched.enqueue(asked);
  assert.equal(asked.blocks.computed, 2 * BLOCK);
  assert.equal(s.pool.freeCount, 4);
  assert.deepEqual(admitAll(s).map((x) => x.seq), [asked]);
  assert.equal(head.bypassed, 1);
  assert.equal(entry.blocks.table.length, 2, "the session was not evicted");
  s.sched.vacate(asked);
  asked.blocks.free();
  assert.deepEqual(admitAll(s).map((x) => x.seq), [head]);
  assert.equal(entry.blocks.table.length, 0, "now it was");

  // Similar without shared blocks (a SimHash near a resident session's) counts too; one that
  // is neither does not; and the head is passed over at most MAX_BYPASS times.
  const t = setup(1 + 8, { maxSlots: 1, maxQueued: 20 });
  const near = Array.from({ length: 40 }, (_, i) => 7 + ((i * 11) % 200));
  const nearHash = promptSimhash(near);
  idleSession(t, "resident", Array.from({ length: 3 * BLOCK }, (_, i) => 3000 + i), nearHash);
  const big = seq(t.pool, 80, 16, 5000); // 6 blocks of 5 free
  t.sched.enqueue(big);
  t.sched.enqueue(seq(t.pool, 20, 2, 7000)); // fits, shares nothing
  const alike = Array.from({ length: MAX_BYPASS + 1 }, () => seq(t.pool, near, 2));
  for (const a of alike) t.sched.enqueue(a);
  const order: Sequence[] = [];
  for (let i = 0; i < MAX_BYPASS + 1; i++) {
    const [a] = admitAll(t);
    order.push(a.seq);
    t.sched.vacate(a.seq);
    a.seq.blocks.free();
  }
  assert.deepEqual(order, [...alike.slice(0, MAX_BYPASS), big]);
  assert.ok(AFFINITY_WINDOW >= 2);
});

Deno.test("scheduler: a head whose blocks are still being read waits, then counts them cached", async () => {
  const s = setup(1 + 8);
  const ids = Array.from({ length: 2 * BLOCK + 4 }, (_, i) => 40 + i);
  // The GPU's cache holds the prompt's first block (found once the read is in).
  const cachedBlock = new SequenceBlocks(s.pool);
  cachedBlock.appendPrompt(ids.slice(0, BLOCK));
  cachedBlock.reserve(BLOCK);
  cachedBlock.markComputed(BLOCK);
  cachedBlock.free();
  let arrive!: () => void;
  const read = new Promise<void>((r) => (arrive = r));
  const h0 = blockHash(0n, ids.slice(0, BLOCK)), h1 = blockHash(h0, ids.slice(BLOCK, 2 * BLOCK));
  const plan = new RestorePlan([
    { hash: h0, tokens: ids.slice(0, BLOCK), tier: "gpu" },
    {
      hash: h1,
      tokens: ids.slice(BLOCK, 2 * BLOCK),
      tier: "file",
      load: () => read.then(() => undefined),
    },
  ], 4);
  const q = seq(s.pool, ids, 4, 0, plan);
  s.sched.enqueue(q);
  const other = seq(s.pool, 10, 2, 500);
  s.sched.enqueue(other);
  assert.ok(s.sched.restoring);
  assert.deepEqual(admitAll(s), [], "the queue waits behind it");
  arrive();
  await plan.done;
  assert.ok(!s.sched.restoring);
  assert.deepEqual(admitAll(s).map((x) => x.seq), [q, other].slice(0, OPTS.maxSlots));
  // The first block came from the GPU's cache; the second could not be read: it is prefilled.
  assert.equal(q.blocks.computed, BLOCK);
  q.fail(new Error("done"));
});
