/**
 * A submission the GPU rejects fails its requests with the GPU's message, and the engine goes on;
 * a submission is encoded, then submitted or discarded, then read, in that order only.
 */
import assert from "node:assert/strict";
import { Engine } from "../engine/engine.ts";
import { sampling } from "../api/types.ts";
import { withTestModel } from "../scripts/make_test_model.ts";

const SMALL_MODEL = { arch: "llama", dtype: "f16", hidden: 64, heads: 2, kvHeads: 1 } as const;
import { bindGroup } from "../gpu/dispatch.ts";
import { pipeline } from "../kernels/pipeline.ts";
import { fillRandomDispatch } from "../kernels/fill_random.ts";
import { createStorage, readF32 } from "../gpu/device.ts";
import { testGpu } from "./util.ts";

Deno.test("submission: a GPU validation error rejects `done` with the GPU's message", async () => {
  const gpu = await testGpu();
  await withTestModel(SMALL_MODEL, async (dir) => {
    const engine = await Engine.load(dir, { maxSlots: 2, contextLength: 64 });
    // A real pipeline bound to a buffer too small for its uniform: invalid on every backend.
    const pipe = pipeline(gpu, "step.wgsl", { entryPoint: "step_begin", constants: { WG: 64 } });
    const tiny = gpu.device.createBuffer({ size: 4, usage: GPUBufferUsage.UNIFORM });
    const [seqLen, pos, slotState] = [8, 8, 32].map((bytes) => createStorage(gpu, bytes));
    gpu.device.pushErrorScope("validation"); // the bind group's own error is expected here
    const bad = {
      label: "bad",
      pipeline: pipe,
      bindGroup: bindGroup(gpu, pipe, [tiny, seqLen, pos, slotState]),
      workgroups: [1, 1, 1] as [number, number, number],
    };
    await gpu.device.popErrorScope();
    const sub = engine.runner.submission([bad], {
      region: 0,
      steps: 1,
      slots: [undefined, undefined],
      top: false,
    });
    assert.throws(() => sub.done, /read when encoded/);
    sub.submit();
    assert.throws(() => sub.submit(), /submitted when submitted/);
    assert.throws(() => sub.discard(), /discarded when submitted/);
    await assert.rejects(sub.done, /internal error: the GPU rejected a submission/);
    // The engine still serves.
    const gen = engine.generate({ promptIds: [1, 2, 3], sampling: sampling({ maxTokens: 4 }) });
    let n = 0;
    for await (const _ of gen) n++;
    assert.equal(n, 4);
  });
});

Deno.test("submission: a discarded submission never runs", async () => {
  const gpu = await testGpu();
  await withTestModel(SMALL_MODEL, async (dir) => {
    const engine = await Engine.load(dir, { maxSlots: 1, contextLength: 64 });
    const target = createStorage(gpu, 64 * 4);
    const fill = fillRandomDispatch(gpu, target, { count: 64, dtype: "f32", scale: 1, seed: 3 });
    const o = { region: 0, steps: 0, slots: [undefined], top: false };
    const dropped = engine.runner.submission([fill], o);
    dropped.discard();
    assert.throws(() => dropped.submit(), /submitted when discarded/);
    assert.throws(() => dropped.done, /read when discarded/);
    // Anything submitted later is done only after the GPU is idle: the target is still zeros.
    const later = engine.runner.submission([], o);
    later.submit();
    await later.done;
    assert.deepEqual([...await readF32(gpu, target, 64)], new Array(64).fill(0));
    // The same dispatch, submitted, does write it.
    const kept = engine.runner.submission([fill], o);
    kept.submit();
    await kept.done;
    assert.ok((await readF32(gpu, target, 64)).some((v) => v !== 0));
  });
});
