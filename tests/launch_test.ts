/**
 * scripts/launch.ts: the permissions `deno task start` and `deno task generate` give main.ts
 * for their flags, and both tasks run for real with them (a model outside the repository, a
 * session store, SIGTERM through the launcher).
 */
import assert from "node:assert/strict";
import { GENERATE_ENV, permissions, SERVE_ENV } from "../scripts/launch.ts";
import { makeTestModel } from "../scripts/make_test_model.ts";
import { serverAddress } from "./util.ts";

const ROOT = new URL("..", import.meta.url).pathname.replace(/\/$/, "");
const none = () => undefined;

Deno.test("launch: each flag grants what it names, and nothing else", () => {
  const env = `--allow-env=${SERVE_ENV.join(",")}`;
  assert.deepEqual(permissions("serve", [], none), [
    "--no-prompt",
    `--allow-read=${ROOT}`,
    "--allow-net=127.0.0.1:8000,127.0.0.1",
    env,
  ]);
  assert.deepEqual(
    permissions("serve", ["--model", "/m", "--kv", "/d/s.sqlite", "--host", "0.0.0.0"], none),
    [
      "--no-prompt",
      `--allow-read=${ROOT},/m,/d/s.sqlite,/d/s.sqlite.cold`,
      "--allow-write=/d/s.sqlite,/d/s.sqlite.cold",
      "--allow-net=0.0.0.0:8000,127.0.0.1",
      env,
    ],
  );
  // A spill folder is read and written (and only with --kv-spill or STRATA_KV_SPILL).
  const spill = permissions("serve", ["--kv-spill", "/s", "--kv-host-mb", "0"], none);
  assert.ok(spill.includes(`--allow-read=${ROOT},/s`), spill.join(" "));
  assert.ok(spill.includes("--allow-write=/s"), spill.join(" "));
  const spillEnv = permissions("serve", [], (k) => (k === "STRATA_KV_SPILL" ? "/e" : undefined));
  assert.ok(spillEnv.includes("--allow-write=/e"), spillEnv.join(" "));
  // The environment stands in for absent flags, as in main.ts; flags win.
  const vars: Record<string, string> = { STRATA_KV: "k.db", STRATA_KV_COLD: "/c", PORT: "0" };
  const fromEnv = permissions("serve", ["--host", "::"], (k) => vars[k]);
  assert.ok(fromEnv.includes(`--allow-read=${ROOT},k.db,/c`), fromEnv.join(" "));
  assert.ok(fromEnv.includes("--allow-write=k.db,/c"));
  assert.ok(fromEnv.includes("--allow-net=[::],127.0.0.1"));
  // A remote Deno KV: its host and its token, no file.
  const remote = permissions("serve", ["--kv=https://api.deno.com/databases/x/connect"], none);
  assert.ok(remote.includes("--allow-net=127.0.0.1:8000,127.0.0.1,api.deno.com"));
  assert.ok(
    remote.some((f) => f.startsWith("--allow-env=") && f.endsWith(",DENO_KV_ACCESS_TOKEN")),
  );
  assert.ok(!remote.some((f) => f.startsWith("--allow-write")));
  assert.deepEqual(permissions("generate", ["--model=/m", "--prompt", "hi"], none), [
    "--no-prompt",
    `--allow-read=${ROOT},/m`,
    `--allow-env=${GENERATE_ENV.join(",")}`,
  ]);
  assert.throws(() => permissions("bench", [], none), /"serve" or "generate"/);
});

Deno.test("launch: deno task start and generate run with those permissions", async () => {
  const dir = await Deno.makeTempDir({ prefix: "strata_launch_" });
  const model = `${dir}/model`, kv = `${dir}/sessions.sqlite`;
  await makeTestModel(model, {});
  try {
    const gen = await new Deno.Command(Deno.execPath(), {
      args: ["task", "generate", "--model", model, "--prompt-ids", "1,2,3", "--max-tokens", "2"]
        .concat("--json"),
      cwd: ROOT,
      stdout: "piped",
      stderr: "piped",
    }).output();
    const stderr = new TextDecoder().decode(gen.stderr);
    assert.equal(gen.code, 0, stderr);
    assert.equal(JSON.parse(new TextDecoder().decode(gen.stdout)).tokens.length, 2);

    const child = new Deno.Command(Deno.execPath(), {
      args: ["task", "start", "--model", model, "--port", "0", "--kv", kv],
      cwd: ROOT,
      stdout: "null",
      stderr: "piped",
    }).spawn();
    const { url, closed } = await serverAddress(child.stderr);
    const res = await fetch(`${url}/v1/completions`, {
      method: "POST",
      headers: { "content-type": "application/json" },
      body: JSON.stringify({ prompt: "Once", max_tokens: 2, session_id: "s" }),
    });
    assert.equal(res.status, 200, await res.clone().text());
    await res.body?.cancel();
    child.kill("SIGTERM"); // the launcher's: it passes it on, and the server drains
    await closed; // until the server's stderr closes
    assert.equal((await child.status).code, 0);
    assert.ok((await Deno.stat(kv)).isFile, "the session store was not written");
  } finally {
    await Deno.remove(dir, { recursive: true });
  }
});
