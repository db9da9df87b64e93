/**
 * The strata chat page. One WebSocket to `/v1/chat/ws` (docs/api.md, "WebSocket") carries each
 * turn as a `start` with the whole history and this page's `session_id`, so the server reuses the
 * conversation's KV cache and prefills only the new tokens. Tokens arrive as `delta`s, the turn ends
 * with `done` (timings, usage) or `error`; Stop sends `cancel`. The socket reconnects when it closes.
 * No framework and no build step: this file is served as is.
 */

/** @param {string} id @returns {any} the element with that id */
const $ = (id) => document.getElementById(id);

/** Session ids allow `A-Za-z0-9_.:-`; crypto.randomUUID needs a secure context, so build one. */
const SESSION_ID = "web-" +
  Array.from(crypto.getRandomValues(new Uint8Array(12)), (b) => b.toString(16).padStart(2, "0"))
    .join("");

/** Sampling fields sent with every `start`; empty inputs are left out (the server's defaults). */
const NUMBER_FIELDS = ["temperature", "top_p", "top_k", "max_tokens", "seed"];
const SETTINGS_KEY = "strata.settings";
const API_KEY_KEY = "strata.api_key";

/** @type {{role: string, content: string}[]} the conversation so far, without the system prompt */
let history = [];
/** @type {WebSocket | null} */
let socket = null;
let retryMs = 500;
let retryTimer = 0;
let turnCounter = 0;
/** The running turn, if any. */
let turn = null;

// ---- settings ----------------------------------------------------------------------------------

function loadSettings() {
  try {
    const saved = JSON.parse(localStorage.getItem(SETTINGS_KEY) ?? "{}");
    for (const name of [...NUMBER_FIELDS, "system"]) {
      if (typeof saved[name] === "string") $(name).value = saved[name];
    }
    $("api_key").value = sessionStorage.getItem(API_KEY_KEY) ?? "";
  } catch { /* storage off or corrupt: keep the defaults */ }
}

function saveSettings() {
  const values = Object.fromEntries(
    [...NUMBER_FIELDS, "system"].map((name) => [name, $(name).value]),
  );
  try {
    localStorage.setItem(SETTINGS_KEY, JSON.stringify(values));
    sessionStorage.setItem(API_KEY_KEY, $("api_key").value);
  } catch { /* storage off: settings last until reload */ }
}

/** @returns {Record<string, number>} the sampling fields of a `start` message */
function samplingFields() {
  const out = {};
  for (const name of NUMBER_FIELDS) {
    const raw = $(name).value.trim();
    if (raw !== "") out[name] = Number(raw);
  }
  return out;
}

// ---- the view ----------------------------------------------------------------------------------

function nearBottom() {
  const log = $("log");
  return log.scrollHeight - log.scrollTop - log.clientHeight < 80;
}

function scrollToEnd() {
  const log = $("log");
  log.scrollTop = log.scrollHeight;
}

/**
 * Appends a message bubble to the log.
 *
 * @param {"user" | "assistant"} role
 * @param {string} text
 * @returns {{el: HTMLElement, body: HTMLElement, meta: HTMLElement}}
 */
function addMessage(role, text) {
  $("empty").hidden = true;
  const el = document.createElement("article");
  el.className = `msg ${role}`;
  const who = document.createElement("h2");
  who.className = "who";
  who.textContent = role === "user" ? "You" : "Model";
  const body = document.createElement("div");
  body.className = "body";
  body.textContent = text;
  const meta = document.createElement("p");
  meta.className = "meta";
  el.append(who, body, meta);
  $("log").append(el);
  scrollToEnd();
  return { el, body, meta };
}

/** @param {string} message shown above the composer until the next turn; "" hides it */
function showAlert(message) {
  $("alert").textContent = message;
  $("alert").hidden = message === "";
}

/** @param {"connecting" | "open" | "closed" | "auth"} state @param {string} text */
function setConnection(state, text) {
  $("conn").dataset.state = state;
  $("conn-text").textContent = text;
  updateControls();
}

function updateControls() {
  const open = socket?.readyState === WebSocket.OPEN;
  $("send").hidden = turn !== null;
  $("stop").hidden = turn === null;
  $("send").disabled = !open;
  $("stop").disabled = turn?.stopping ?? false;
  $("stop").textContent = turn?.stopping ? "Stopping…" : "Stop";
  document.body.dataset.busy = String(turn !== null);
}

/** @param {number} ms @returns {string} */
function formatMs(ms) {
  return ms >= 1000 ? `${(ms / 1000).toFixed(2)} s` : `${Math.round(ms)} ms`;
}

// ---- turns -------------------------------------------------------------------------------------

/** Sends the message in the composer as a new turn. */
function send() {
  const text = $("input").value.trim();
  if (text === "" || turn !== null || socket?.readyState !== WebSocket.OPEN) return;
  saveSettings();
  showAlert("");
  history.push({ role: "user", content: text });
  const question = addMessage("user", text);
  const view = addMessage("assistant", "");
  view.el.dataset.state = "streaming";
  view.el.setAttribute("aria-busy", "true");
  const system = $("system").value.trim();
  const messages = system === "" ? history : [{ role: "system", content: system }, ...history];
  turn = {
    id: `turn-${++turnCounter}`,
    question,
    view,
    userText: text,
    text: "",
    tokens: 0,
    t0: performance.now(),
    tFirst: 0,
    tLast: 0,
    stopping: false,
    abandoned: false,
  };
  socket.send(JSON.stringify({
    type: "start",
    id: turn.id,
    session_id: SESSION_ID,
    messages,
    ...samplingFields(),
  }));
  $("input").value = "";
  updateControls();
}

/** Asks the server to stop the running turn; its `done` (finish_reason "cancelled") follows. */
function stop() {
  if (turn === null || turn.stopping) return;
  turn.stopping = true;
  if (socket?.readyState === WebSocket.OPEN) {
    socket.send(JSON.stringify({ type: "cancel", id: turn.id }));
  } else {
    failTurn("stopped; the connection was closed");
  }
  updateControls();
}

function onDelta(msg) {
  const now = performance.now();
  if (turn.tokens === 0) turn.tFirst = now;
  turn.tLast = now;
  turn.tokens++;
  if (msg.text === "") return;
  const stick = nearBottom();
  turn.text += msg.text;
  turn.view.body.textContent = turn.text;
  if (stick) scrollToEnd();
}

function onDone(msg) {
  const t = turn;
  turn = null;
  if (!t.abandoned && t.text === "" && msg.finish_reason === "cancelled") {
    // Stopped before any text: nothing to keep, so the turn goes as a failed one does.
    dropTurn(t);
    updateControls();
    $("input").focus();
    return;
  }
  const { el, meta } = t.view;
  el.dataset.state = msg.finish_reason === "cancelled" ? "cancelled" : "done";
  el.removeAttribute("aria-busy");
  // A cancelled turn keeps what arrived.
  if (!t.abandoned) history.push({ role: "assistant", content: t.text });
  const tokens = msg.usage?.completion_tokens ?? t.tokens;
  const clientTtft = (t.tFirst || performance.now()) - t.t0;
  const clientTps = t.tLast > t.tFirst ? (t.tokens - 1) / ((t.tLast - t.tFirst) / 1000) : 0;
  const ttft = msg.timings?.ttft_ms ?? clientTtft;
  const tps = msg.timings?.tokens_per_second ?? clientTps;
  const cached = msg.usage?.prompt_tokens_details?.cached_tokens ?? 0;
  const reason = { stop: "finished", length: "hit max tokens", cancelled: "stopped" }[
    msg.finish_reason
  ] ?? msg.finish_reason;
  meta.textContent = `${tokens} tokens · ${tps.toFixed(1)} tok/s · TTFT ${formatMs(ttft)} · ` +
    reason;
  meta.title = `seed ${msg.seed} · prompt ${msg.usage?.prompt_tokens} tokens (${cached} cached)` +
    ` · measured here: TTFT ${formatMs(clientTtft)}, ${clientTps.toFixed(1)} tok/s`;
  $("stat-ttft").textContent = formatMs(ttft);
  $("stat-tps").textContent = tps.toFixed(1);
  $("stat-tokens").textContent = String(tokens);
  $("stat-cached").textContent = `${cached}/${msg.usage?.prompt_tokens ?? "?"}`;
  updateControls();
  if (!t.abandoned) $("input").focus();
}

/**
 * Takes turn `t` out of the conversation: its question and answer leave the log, its question
 * leaves the history (so the next turn does not send it) and returns to the input, to send again.
 */
function dropTurn(t) {
  t.question.el.remove();
  t.view.el.remove();
  $("empty").hidden = $("log").querySelector(".msg") !== null;
  if (t.abandoned) return; // New chat has cleared the history and the log already
  history.pop();
  if ($("input").value === "") $("input").value = t.userText;
}

/**
 * Ends the running turn with an error: the turn is dropped ({@linkcode dropTurn}) and the error
 * is shown once, above the input (not also in an empty answer bubble).
 */
function failTurn(message) {
  const t = turn;
  turn = null;
  if (t === null) return;
  dropTurn(t);
  if (!t.abandoned) showAlert(message);
  updateControls();
}

/** Handles one server message. */
function onMessage(event) {
  let msg;
  try {
    msg = JSON.parse(event.data);
  } catch {
    return showAlert("the server sent a message that is not JSON");
  }
  const mine = turn !== null && msg.id === turn.id;
  if (msg.type === "delta" && mine) onDelta(msg);
  else if (msg.type === "done" && mine) onDone(msg);
  else if (msg.type === "error") {
    // A cancel that crosses its `done` is answered "conversation_not_found"; nothing is wrong.
    if (msg.error?.code === "conversation_not_found") return;
    const text = msg.error?.message ?? "unknown error";
    // An error without an id answers a message the server could not read as far as its id (one
    // over the size limit, say). This page sends one `start` at a time, so while a turn runs
    // that message was its `start`: the turn failed and no `done` will come.
    if (mine || (turn !== null && msg.id === undefined)) failTurn(text);
    else showAlert(text);
  }
}

/** Clears the conversation; a running turn is stopped and its answer discarded. */
function newChat() {
  if (turn !== null) {
    turn.abandoned = true;
    stop();
  }
  history = [];
  for (const el of $("log").querySelectorAll(".msg")) el.remove();
  $("empty").hidden = false;
  showAlert("");
  $("input").focus();
}

// ---- the socket --------------------------------------------------------------------------------

function socketUrl() {
  const url = new URL("v1/chat/ws", location.href);
  url.protocol = url.protocol === "https:" ? "wss:" : "ws:";
  const key = $("api_key").value.trim();
  if (key !== "") url.searchParams.set("api_key", key);
  return url.href;
}

function connect() {
  clearTimeout(retryTimer);
  if (socket !== null) {
    // A new key replaces the socket; the server cancels what ran on the old one.
    const old = socket;
    socket = null;
    old.close();
    if (turn !== null) failTurn("the connection was reopened before the answer finished");
  }
  const ws = new WebSocket(socketUrl());
  let opened = false;
  socket = ws;
  setConnection("connecting", "Connecting…");
  ws.addEventListener("open", () => {
    opened = true;
    retryMs = 500;
    setConnection("open", "Connected");
  });
  ws.addEventListener("message", onMessage);
  ws.addEventListener("close", () => {
    if (socket !== ws) return; // replaced on purpose
    socket = null;
    if (turn !== null) failTurn("the connection closed before the answer finished");
    if (opened) reconnectLater();
    else diagnose();
  });
}

function reconnectLater() {
  setConnection("closed", `Disconnected; retrying in ${Math.ceil(retryMs / 1000)} s`);
  retryTimer = setTimeout(connect, retryMs);
  retryMs = Math.min(retryMs * 2, 10_000);
}

/**
 * A socket refused before it opened says nothing to the page, so ask over HTTP: a 401 means the
 * API key is missing or wrong, and retrying with the same key cannot help.
 */
async function diagnose() {
  const key = $("api_key").value.trim();
  try {
    const res = await fetch("v1/models", {
      headers: key === "" ? {} : { Authorization: `Bearer ${key}` },
    });
    if (res.status === 401) {
      const body = await res.json().catch(() => ({}));
      setConnection("auth", key === "" ? "API key needed" : "API key rejected");
      showAlert(
        `${body.error?.message ?? "the server needs an API key"}. Enter it under Settings.`,
      );
      $("settings-panel").open = true;
      return;
    }
  } catch { /* the server is down: keep retrying */ }
  reconnectLater();
}

/** Shows the served model and caps max_tokens at its context. */
async function loadModelInfo() {
  try {
    const health = await (await fetch("health")).json();
    $("model").textContent = health.model;
    $("model").title = `${health.model} on ${health.adapter}; context ${health.context_length}`;
    if (health.context_length) $("max_tokens").max = String(health.context_length);
  } catch {
    $("model").textContent = "model unknown";
  }
}

// ---- wiring ------------------------------------------------------------------------------------

function init() {
  loadSettings();
  if (matchMedia("(max-width: 860px)").matches) $("settings-panel").open = false;
  $("composer").addEventListener("submit", (e) => {
    e.preventDefault();
    send();
  });
  $("input").addEventListener("keydown", (e) => {
    if (e.key === "Enter" && !e.shiftKey && !e.isComposing) {
      e.preventDefault();
      send();
    }
  });
  $("stop").addEventListener("click", stop);
  $("new-chat").addEventListener("click", newChat);
  $("settings").addEventListener("change", saveSettings);
  $("settings").addEventListener("submit", (e) => e.preventDefault());
  $("api_key").addEventListener("change", () => {
    showAlert("");
    connect();
  });
  // Keep idle connections alive through proxies that close quiet sockets.
  setInterval(() => {
    if (socket?.readyState === WebSocket.OPEN) socket.send('{"type":"ping"}');
  }, 30_000);
  loadModelInfo();
  connect();
  updateControls();
  $("input").focus();
}

init();
