/**
 * The chat page in a real browser: headless Chromium (through playwright-core) against the real
 * server and the real default model. It enters the API key the server asks for, streams a turn
 * over the WebSocket, stops a long generation (the engine must free the sequence), survives a
 * dropped socket, shows a server error once (dropping the failed turn from the log and from the
 * history it sends next, also for an error without a conversation id), and continues the same
 * session with a cached prefix.
 * Screenshots go to test-artifacts/. Skipped (ignored) when /usr/bin/chromium is absent.
 */
import assert from "node:assert/strict";
import { type Browser, chromium, type Page } from "playwright-core";
import { WorkerEngine } from "../engine/worker/host.ts";
import { createApp } from "../routes/app.ts";

const CHROMIUM = "/usr/bin/chromium";
const MODEL_DIR = new URL("../models/strata-default", import.meta.url).pathname;
const ARTIFACTS = new URL("../test-artifacts/", import.meta.url).pathname;
const KEY = "sk-browser-test";
/** The server's body and WebSocket message limit in this test, bytes. */
const MAX_MESSAGE = 64 * 1024;

function exists(path: string): boolean {
  try {
    Deno.statSync(path);
    return true;
  } catch {
    return false;
  }
}

const hasChromium = exists(CHROMIUM);
if (!hasChromium) {
  console.log(`browser test skipped: ${CHROMIUM} is absent (apt-get install chromium)`);
}

/**
 * Page script: counts the separate text updates of answers in `updates`, so a test can tell a
 * streamed answer (many updates) from one that arrived whole. A string: the test has no DOM types.
 */
const COUNT_UPDATES = `
  globalThis.updates = 0;
  new MutationObserver((records) => {
    for (const r of records) if (r.target.closest?.(".msg.assistant .body")) updates++;
  }).observe(document.getElementById("log"), { childList: true, subtree: true });
`;

/** Polls `check` until it returns true, failing with `what` after `ms`. */
async function until(what: string, check: () => boolean, ms = 10_000): Promise<void> {
  const end = Date.now() + ms;
  while (!check()) {
    if (Date.now() > end) throw new Error(`timed out after ${ms} ms waiting for ${what}`);
    await new Promise((r) => setTimeout(r, 25));
  }
}

/** The last assistant message's state and text. */
function lastAnswer(page: Page) {
  const el = page.locator(".msg.assistant").last();
  return {
    el,
    state: () => el.getAttribute("data-state"),
    text: () => el.locator(".body").innerText(),
    meta: () => el.locator(".meta").innerText(),
  };
}

/** Types `text` into the composer and presses Send. */
async function say(page: Page, text: string): Promise<void> {
  await page.getByLabel("Message").fill(text);
  await page.getByRole("button", { name: "Send" }).click();
}

/** Fills the sampling settings by their labels. */
async function settings(page: Page, values: Record<string, string>): Promise<void> {
  for (const [label, value] of Object.entries(values)) {
    await page.getByLabel(label, { exact: true }).fill(value);
  }
}

Deno.test({
  name: "chat page: key, stream, stop, reconnect, errors, follow-up in one session",
  ignore: !hasChromium,
  async fn(t) {
    // As `main.ts serve` runs it: the engine in a worker, whose GPU waits (on llvmpipe, whole
    // submissions) block that thread, not this one's server and Playwright client.
    const engine = await WorkerEngine.load({ dir: MODEL_DIR }, { maxSlots: 4 });
    const server = Deno.serve(
      { hostname: "127.0.0.1", port: 0, onListen() {} },
      // A message limit the test can pass with one long question (the default is 1 MiB).
      createApp(engine, { apiKey: KEY, maxBodyBytes: MAX_MESSAGE }).fetch,
    );
    const base = `http://127.0.0.1:${server.addr.port}/`;
    let browser: Browser | undefined;
    try {
      browser = await chromium.launch({
        executablePath: CHROMIUM,
        args: [
          "--headless",
          "--no-sandbox",
          "--disable-gpu",
          "--disable-quic",
          "--no-first-run",
          "--disable-background-networking",
          "--disable-component-update",
          "--disable-sync",
        ],
      });
      const page = await browser.newPage({ viewport: { width: 1200, height: 820 } });
      const pageErrors: string[] = [];
      page.on("pageerror", (e) => pageErrors.push(String(e)));
      // Every frame the page sends on its sockets, parsed.
      const sent: Record<string, unknown>[] = [];
      page.on("websocket", (ws) =>
        ws.on("framesent", (f) => {
          if (typeof f.payload === "string") sent.push(JSON.parse(f.payload));
        }));
      const conn = page.locator("#conn");

      await t.step("the page asks for the API key, then connects", async () => {
        await page.goto(base);
        await page.getByRole("alert").filter({ hasText: "API key" }).waitFor();
        assert.equal(await conn.getAttribute("data-state"), "auth");
        assert.match(await page.locator("#model").innerText(), /strata-default/);
        await page.getByLabel("API key").fill(KEY);
        await page.getByLabel("API key").press("Tab"); // "change" reconnects
        await page.locator('#conn[data-state="open"]').waitFor();
        assert.equal(await page.getByRole("alert").isHidden(), true);
      });

      await t.step("a turn streams token by token and ends with timings", async () => {
        await settings(page, {
          "System prompt": "You are a helpful assistant.",
          "Temperature": "0.8",
          "Max tokens": "40",
          "Seed": "3",
        });
        // Count the separate text updates of the answer: more than one means it streamed.
        await page.evaluate(COUNT_UPDATES);
        await say(page, "Tell me about the sea.");
        const answer = lastAnswer(page);
        await page.locator('.msg.assistant[data-state="done"]').waitFor({ timeout: 60_000 });
        const text = await answer.text();
        assert.ok(text.trim().length > 0, "the answer is empty");
        const updates = await page.evaluate<number>("updates");
        assert.ok(updates >= 2, `the answer arrived in ${updates} update(s), not streamed`);
        assert.match(await answer.meta(), /\d+ tokens · [\d.]+ tok\/s · TTFT [\d.]+ m?s/);
        assert.match(await page.locator("#stat-tps").innerText(), /^\d+\.\d$/);
        const start = sent.find((m) => m.type === "start")!;
        assert.equal(start.max_tokens, 40);
        assert.equal(start.seed, 3);
        assert.match(String(start.session_id), /^web-[0-9a-f]{24}$/);
        assert.deepEqual(start.messages, [
          { role: "system", content: "You are a helpful assistant." },
          { role: "user", content: "Tell me about the sea." },
        ]);
      });

      await t.step("Stop cancels a long generation and the engine frees it", async () => {
        // Temperature 2 without top-k/top-p makes the end-of-turn token rare; with this seed the
        // answer runs for hundreds of tokens, far longer than the test waits before Stop.
        await settings(page, {
          "Temperature": "2",
          "Top p": "1",
          "Top k": "0",
          "Max tokens": "900",
          "Seed": "2",
        });
        await say(page, "Now write a very long story.");
        const answer = lastAnswer(page);
        const stopButton = page.getByRole("button", { name: "Stop" });
        await until(
          "the engine to run the sequence",
          () => engine.occupancy().running === 1,
          30_000,
        );
        // Stop once text has arrived, so the partial answer stays in the history.
        await answer.el.locator(".body").filter({ hasText: /\S/ }).waitFor({ timeout: 60_000 });
        assert.equal(await answer.state(), "streaming", "the answer ended before Stop");
        await stopButton.click();
        await page.locator('.msg.assistant[data-state="cancelled"]').waitFor({ timeout: 30_000 });
        assert.match(await answer.meta(), /stopped$/);
        const stopped = await answer.text();
        await new Promise((r) => setTimeout(r, 1000));
        assert.equal(await answer.text(), stopped, "text kept growing after Stop");
        assert.equal(await stopButton.isHidden(), true);
        assert.equal(await page.getByRole("button", { name: "Send" }).isEnabled(), true);
        await until("engine to free the sequence", () => {
          const load = engine.occupancy();
          return load.running === 0 && load.queued === 0;
        });
        assert.ok(sent.some((m) => m.type === "cancel"), "no cancel frame was sent");
        const tokens = Number((await answer.meta()).match(/^(\d+) tokens/)![1]);
        assert.ok(tokens < 900, `the generation ran to ${tokens} tokens`);
      });

      await t.step("a dropped socket reconnects", async () => {
        await page.evaluate("socket.close()"); // app.js's socket
        await page.locator('#conn[data-state="closed"]').waitFor();
        await page.locator('#conn[data-state="open"]').waitFor({ timeout: 10_000 });
      });

      await t.step("a server error is shown once and the failed turn leaves the log", async () => {
        const before = await page.locator(".msg").count();
        await settings(page, { "Max tokens": "5000" });
        await say(page, "This cannot fit.");
        const alert = page.getByRole("alert");
        await alert.filter({ hasText: "context" }).waitFor({ timeout: 10_000 });
        const message = await alert.innerText();
        assert.match(message, /max_tokens/);
        // Once: in the alert, not again in an answer bubble; neither the question nor an empty
        // answer stays in the log, and the question is back in the input.
        assert.equal(await page.getByText(message, { exact: true }).count(), 1);
        assert.equal(await page.locator(".msg").count(), before);
        assert.equal(await page.getByLabel("Message").inputValue(), "This cannot fit.");
        assert.equal(await page.getByRole("button", { name: "Send" }).isEnabled(), true);
      });

      await t.step("an error without a conversation id ends the running turn", async () => {
        // Over the server's message limit, the `start` is refused before its id is read, so
        // the error carries no id; the page must still end the turn it belonged to.
        const before = await page.locator(".msg").count();
        await settings(page, { "Max tokens": "32" });
        const huge = "a question far too long to send ".repeat(Math.ceil(MAX_MESSAGE / 32)).trim();
        await say(page, huge);
        const alert = page.getByRole("alert");
        await alert.filter({ hasText: `over ${MAX_MESSAGE} bytes` }).waitFor({ timeout: 10_000 });
        assert.equal(await page.locator(".msg").count(), before);
        assert.equal(await page.getByLabel("Message").inputValue(), huge);
        assert.equal(await page.getByRole("button", { name: "Stop" }).isHidden(), true);
        assert.equal(await page.getByRole("button", { name: "Send" }).isEnabled(), true);
      });

      await t.step("a follow-up continues the session with its cached prefix", async () => {
        await settings(page, {
          "Temperature": "0.8",
          "Top p": "0.95",
          "Top k": "40",
          "Max tokens": "32",
          "Seed": "5",
        });
        await say(page, "Thank you. Say goodbye.");
        await page.locator(".msg.assistant").last().and(
          page.locator('[data-state="done"]'),
        ).waitFor({ timeout: 60_000 });
        const starts = sent.filter((m) => m.type === "start");
        const last = starts[starts.length - 1];
        assert.equal(last.session_id, starts[0].session_id);
        const roles = (last.messages as { role: string }[]).map((m) => m.role);
        // The failed turns are not in the history; the stopped one kept its partial answer.
        assert.deepEqual(roles, ["system", "user", "assistant", "user", "assistant", "user"]);
        const said = (last.messages as { content: string }[]).map((m) => m.content);
        assert.ok(!said.includes("This cannot fit."), "the failed question was sent again");
        assert.ok(said.every((c) => c.length < MAX_MESSAGE), "the refused question was sent again");
        assert.equal(await page.locator(".msg").count(), 6, "the log shows three turns");
        const [cached, prompt] = (await page.locator("#stat-cached").innerText()).split("/");
        assert.ok(
          Number(cached) > 0 && Number(cached) < Number(prompt),
          `cached ${cached}/${prompt}`,
        );
        // The page's session, as its tenant (the key's) sees it.
        const r = await fetch(`${base}v1/sessions/${last.session_id}`, {
          headers: { authorization: `Bearer ${KEY}` },
        });
        const session = await r.json();
        assert.ok(r.ok && session.tokens >= Number(prompt), JSON.stringify(session));
        await Deno.mkdir(ARTIFACTS, { recursive: true });
        await page.screenshot({ path: `${ARTIFACTS}chat_page.png` });
        await page.setViewportSize({ width: 390, height: 780 });
        await page.screenshot({ path: `${ARTIFACTS}chat_page_narrow.png` });
      });

      await t.step("New chat clears the conversation", async () => {
        await page.getByRole("button", { name: "New chat" }).click();
        assert.equal(await page.locator(".msg").count(), 0);
        assert.deepEqual(pageErrors, []);
      });
    } finally {
      await browser?.close();
      await server.shutdown();
      await engine.close();
    }
  },
});
