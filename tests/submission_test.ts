/** A submission the GPU rejects fails its requests with the GPU's message, and the engine goes on. */
import assert from "node:assert/strict";
import { Engine } from "../engine/engine.ts";
import { sampling } from "../engine/api.ts";
import { Submission } from "../engine/submission.ts";
import { makeTestModel } from "../scripts/make_test_model.ts";
import { bindGroup, pipeline } from "../kernels/dispatch.ts";
import { testGpu } from "./util.ts";

Deno.test("submission: a GPU validation error rejects `done` with the GPU's message", async () => {
  const gpu = await testGpu();
  const dir = await Deno.makeTempDir({ prefix: "strata-sub-" });
  try {
    await makeTestModel(dir, { arch: "llama", dtype: "f16", hidden: 64, heads: 2, kvHeads: 1 });
    const engine = await Engine.load(dir, { maxSlots: 2, contextLength: 64 });
    // A real pipeline bound to a buffer too small for its uniform: invalid on every backend.
    const pipe = pipeline(gpu, "step.wgsl", { entryPoint: "step_begin", constants: { WG: 64 } });
    const tiny = gpu.device.createBuffer({ size: 4, usage: GPUBufferUsage.UNIFORM });
    const s = engine.decoder.step;
    gpu.device.pushErrorScope("validation"); // the bind group's own error is expected here
    const bad = {
      label: "bad",
      pipeline: pipe,
      bindGroup: bindGroup(gpu, pipe, [tiny, s.seqLen, s.pos, s.slotState]),
      workgroups: [1, 1, 1] as [number, number, number],
    };
    await gpu.device.popErrorScope();
    const sub = new Submission(engine.decoder, [bad], {
      region: 0,
      steps: 1,
      slots: [undefined, undefined],
      top: false,
    });
    assert.throws(() => sub.done, /read before it was submitted/);
    sub.submit();
    assert.throws(() => sub.submit(), /submitted twice/);
    await assert.rejects(sub.done, /internal error: the GPU rejected a submission/);
    // The engine still serves.
    const gen = engine.generate({ promptIds: [1, 2, 3], sampling: sampling({ maxTokens: 4 }) });
    let n = 0;
    for await (const _ of gen) n++;
    assert.equal(n, 4);
  } finally {
    await Deno.remove(dir, { recursive: true });
  }
});
