/**
 * `main.ts serve`'s hardening flags as a user gives them: bad values are refused before the
 * model loads, and a real server started with them does what they say (several keys, the Host
 * allow-list, the header timeout, the connection limit).
 */
import assert from "node:assert/strict";
import { makeTestModel } from "../scripts/make_test_model.ts";
import { head, rawRequest } from "./raw_http.ts";
import { serverAddress } from "./util.ts";

const MAIN = new URL("../main.ts", import.meta.url).pathname;

Deno.test("serve: bad limits, timeouts, hosts and keys are refused before the model loads", async () => {
  const cases: [string[], RegExp][] = [
    [["--max-connections", "0"], /--max-connections must be >= 1; got 0/],
    [["--max-connections", "many"], /--max-connections must be an integer; got 'many'/],
    [["--header-timeout", "0"], /--header-timeout must be a number of seconds > 0; got '0'/],
    [["--idle-timeout", "soon"], /--idle-timeout must be a number; got 'soon'/],
    [["--body-timeout=-1"], /--body-timeout must be a number of seconds > 0; got '-1'/],
    [["--allowed-hosts", ","], /--allowed-hosts must name at least one host name/],
    [["--api-key", " "], /--api-key must not be empty/],
  ];
  for (const [args, message] of cases) {
    const out = await new Deno.Command(Deno.execPath(), {
      args: ["run", "-A", MAIN, "serve", "--port", "0", "--model", "/nonexistent", ...args],
      stdout: "null",
      stderr: "piped",
    }).output();
    const stderr = new TextDecoder().decode(out.stderr);
    assert.equal(out.code, 1, `${args.join(" ")}: ${stderr}`);
    assert.match(stderr, message);
  }
});

Deno.test("serve: two keys, an allowed host, a header timeout and a connection limit", async () => {
  const dir = await Deno.makeTempDir({ prefix: "strata_flags_" });
  await makeTestModel(dir, {});
  const child = new Deno.Command(Deno.execPath(), {
    args: [
      ...["run", "-A", MAIN, "serve", "--model", dir, "--port", "0"],
      ...[
        "--api-key",
        "key-one",
        "--api-key",
        "key-two",
        "--allowed-hosts",
        "strata.test,127.0.0.1",
      ],
      ...["--header-timeout", "0.5", "--max-connections", "2"],
    ],
    stdout: "null",
    stderr: "piped",
  }).spawn();
  try {
    const { port } = await serverAddress(child.stderr);
    const get = (host: string, key?: string) =>
      rawRequest(port, [
        head("GET", "/v1/models", { host, ...(key ? { authorization: `Bearer ${key}` } : {}) }),
      ]);
    assert.equal((await get("strata.test", "key-one")).status, 200);
    assert.equal((await get("strata.test:8000", "key-two")).status, 200);
    assert.equal((await get("strata.test", "key-three")).status, 401);
    assert.equal((await get("localhost", "key-one")).status, 421, "not on --allowed-hosts");
    // A socket that sends nothing is closed after 0.5 s.
    const silent = await rawRequest(port, [], { timeoutMs: 5000, untilResponse: false });
    assert.ok(silent.closed && silent.raw === "", JSON.stringify(silent));
    // Two WebSockets hold both connections: a third connection is shed with a 503.
    const open = () =>
      new Promise<WebSocket>((resolve, reject) => {
        const ws = new WebSocket(`ws://127.0.0.1:${port}/v1/chat/ws?api_key=key-one`);
        ws.onopen = () => resolve(ws);
        ws.onerror = () => reject(new Error("the WebSocket did not open"));
      });
    const sockets = [await open(), await open()];
    const shed = await get("strata.test", "key-one");
    assert.equal(shed.status, 503, shed.raw);
    assert.equal(JSON.parse(shed.body).error.code, "server_busy");
    for (const ws of sockets) {
      const closed = new Promise((r) => (ws.onclose = r));
      ws.close();
      await closed;
    }
  } finally {
    child.kill("SIGTERM");
    await child.status;
    await Deno.remove(dir, { recursive: true });
  }
});
