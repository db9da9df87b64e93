/**
 * The machinery of `deno task test` (scripts/run_tests.ts) and `deno task test:gl`
 * (scripts/test_gl.ts): run `deno test` processes one after another, tee their output, read the
 * counts of each one's summary line, and print one summary of them all at the end.
 *
 * wgpu in Deno 2.9.6 sometimes aborts while a test process exits, after every test has run and
 * the summary is printed ("double free or corruption", SIGABRT): on GL about one run in four, on
 * lavapipe about one in five to ten of the whole suite; never mid-test. Rarely the same teardown
 * ends in SIGSEGV instead (seen once on GL, after tests/kernels_fused_test.ts's passing summary;
 * not in four reruns). Such an exit counts as a pass only when the summary says "0 failed"; the
 * runner then says so in one note, in place of the crash's own message. Any other failure fails.
 */
import { formatDuration } from "./duration.ts";

/** The counts of one `deno test` summary, or of several added up. */
export interface TestCounts {
  passed: number;
  failed: number;
  ignored: number;
}

/**
 * `deno test`'s summary line, as it prints it last: `ok | 3 passed (2 steps) | 0 failed | 1
 * ignored (6ms)` or `FAILED | 1 passed | 2 failed (1 step) (7ms)`.
 */
const SUMMARY =
  /^(ok|FAILED) \| (\d+) passed(?: \(\d+ steps?\))? \| (\d+) failed(?: \(\d+ steps?\))?(?: \| (\d+) ignored(?: \(\d+ steps?\))?)?.* \([^()]+\)$/;

/**
 * The counts of the summary `output` ends with; null when its last line is none (a process that
 * died mid-run). Only the last line counts: a summary printed earlier, by a test, say, does not.
 */
export function parseSummary(output: string): TestCounts | null {
  const last = output.trimEnd().split("\n").at(-1) ?? "";
  const m = last.match(SUMMARY);
  if (!m) return null;
  return { passed: Number(m[2]), failed: Number(m[3]), ignored: Number(m[4] ?? 0) };
}

/** One test process: `command args` (a `deno test` run, or anything that prints its summary). */
export interface TestRun {
  /** Names the run in notes and the summary, e.g. `tests/kernels_linear_test.ts on GL`. */
  label: string;
  /** Default: this Deno. */
  command?: string;
  args: string[];
  /** Added to the environment. */
  env?: Record<string, string>;
}

/** What one {@linkcode TestRun} came to. */
export interface RunOutcome {
  label: string;
  /** 0 when it passed (also after wgpu's crash at exit following a passing summary). */
  code: number;
  /** Its summary's counts; null when it printed none. */
  counts: TestCounts | null;
  /** Why it failed without a summary, or why a crash still counts as a pass. */
  note?: string;
}

/** Where {@linkcode runTests} writes; by default this process's stdout and stderr. */
export interface Sinks {
  /** The child's stdout, as it comes. */
  stdout?: (chunk: Uint8Array) => Promise<unknown> | unknown;
  /** The child's stderr, as it comes (held back once its summary is out; see the module doc). */
  stderr?: (chunk: Uint8Array) => Promise<unknown> | unknown;
}

const toStdout = (c: Uint8Array) => Deno.stdout.write(c);
const toStderr = (c: Uint8Array) => Deno.stderr.write(c);

/** A `deno test ARGS` run of this Deno, with `env` added. */
export function denoTest(label: string, args: string[], env: Record<string, string> = {}): TestRun {
  return { label, args: ["test", ...args], env };
}

/**
 * Runs one test process, its output teed to `sinks`, and tells whether it passed: exit 0, or
 * wgpu's teardown crash (SIGABRT, SIGSEGV) after a summary that says "0 failed".
 */
export async function runTests(run: TestRun, sinks: Sinks = {}): Promise<RunOutcome> {
  const stdout = sinks.stdout ?? toStdout, stderr = sinks.stderr ?? toStderr;
  const child = new Deno.Command(run.command ?? Deno.execPath(), {
    args: run.args,
    env: { ...run.env, NO_COLOR: "1" }, // plain text: the summary is matched
    stdout: "piped",
    stderr: "piped",
  }).spawn();
  let tail = "", summaryOut = false;
  const held: Uint8Array[] = [];
  const decoder = new TextDecoder();
  const out = (async () => {
    for await (const chunk of child.stdout) {
      await stdout(chunk);
      tail = (tail + decoder.decode(chunk, { stream: true })).slice(-4096);
      summaryOut = parseSummary(tail) !== null;
    }
  })();
  // What the child says on stderr after its summary waits for its exit status: the teardown
  // crash's own message ("double free or corruption"), its last line, gives way to one note that
  // explains it.
  const err = (async () => {
    for await (const chunk of child.stderr) {
      if (summaryOut) held.push(chunk);
      else await stderr(chunk);
    }
  })();
  const [status] = await Promise.all([child.status, out, err]);
  const counts = parseSummary(tail);
  const outcome = (code: number, note?: string) => ({ label: run.label, code, counts, note });
  if (status.success) {
    for (const chunk of held) await stderr(chunk);
    return outcome(0);
  }
  const signal = status.signal ?? (status.code > 128 ? `exit ${status.code}` : undefined);
  const teardown = ["SIGABRT", "SIGSEGV"].includes(status.signal ?? "") ||
    [134, 139].includes(status.code);
  if (teardown && counts?.failed === 0) {
    // The crash's message is the last line; anything before it (a warning read late) goes on.
    const lines = new TextDecoder().decode(concat(held)).trimEnd().split("\n");
    const said = lines.pop()?.trim();
    if (lines.length) await stderr(new TextEncoder().encode(`${lines.join("\n")}\n`));
    return outcome(
      0,
      `every test passed; the process then ended with ${signal} in wgpu's teardown` +
        (said ? ` ("${said.slice(0, 80)}")` : "") +
        ", a known Deno 2.9.6 crash after the summary, so it counts as passed",
    );
  }
  for (const chunk of held) await stderr(chunk);
  if (counts === null) {
    return outcome(
      status.code || 1,
      `the process ended (${signal ?? `exit ${status.code}`}) before its summary; ` +
        "counted as 1 failed",
    );
  }
  return outcome(status.code || 1);
}

function concat(chunks: Uint8Array[]): Uint8Array {
  const all = new Uint8Array(chunks.reduce((n, c) => n + c.length, 0));
  let at = 0;
  for (const c of chunks) {
    all.set(c, at);
    at += c.length;
  }
  return all;
}

/** Test runs under one heading of the summary ("the suite", "the kernel tests on GL"). */
export interface TestGroup {
  name: string;
  runs: TestRun[];
}

/** What {@linkcode runGroups} came to. */
export interface GroupsOutcome {
  /** 0 when every run passed. */
  code: number;
  total: TestCounts;
  /** The lines printed last: notes, failed runs, then the one summary line. */
  report: string[];
}

/** Options of {@linkcode runGroups}. */
export interface GroupsOptions extends Sinks {
  /** Prefix of the report's lines (default "test"). */
  name?: string;
  /** Progress before each run (default: to stderr when it is a terminal). */
  progress?: (line: string) => void;
}

/** "380 passed, 0 failed, 1 ignored" (ignored only when there are some). */
export function formatCounts(c: TestCounts): string {
  return `${c.passed} passed, ${c.failed} failed` + (c.ignored ? `, ${c.ignored} ignored` : "");
}

/** Counts of `outcomes` added up; a run without a summary counts as one failed test. */
export function addCounts(outcomes: RunOutcome[]): TestCounts {
  const total = { passed: 0, failed: 0, ignored: 0 };
  for (const o of outcomes) {
    total.passed += o.counts?.passed ?? 0;
    total.failed += o.counts?.failed ?? (o.code === 0 ? 0 : 1);
    total.ignored += o.counts?.ignored ?? 0;
  }
  return total;
}

/**
 * Runs every group's runs one after another (all of them, also after a failure, so the summary
 * covers everything), then prints the report: a note per run that needs one, the runs that
 * failed, and last one line with the counts of all groups added up and of each group.
 */
export async function runGroups(
  groups: TestGroup[],
  options: GroupsOptions = {},
): Promise<GroupsOutcome> {
  const name = options.name ?? "test";
  const tty = Deno.stderr.isTerminal();
  const progress = options.progress ?? ((line: string) => tty && console.error(line));
  const t0 = performance.now();
  const all = groups.reduce((n, g) => n + g.runs.length, 0);
  const byGroup: RunOutcome[][] = [];
  let done = 0;
  for (const group of groups) {
    const outcomes: RunOutcome[] = [];
    for (const run of group.runs) {
      const since = formatDuration(performance.now() - t0);
      progress(`${name}: [${++done}/${all}] ${group.name}: ${run.label} (${since} so far)`);
      outcomes.push(await runTests(run, options));
    }
    byGroup.push(outcomes);
  }
  const outcomes = byGroup.flat();
  const total = addCounts(outcomes);
  const report: string[] = [];
  for (const o of outcomes) {
    if (o.note) report.push(`${name}: ${o.label}: ${o.note}`);
    if (o.code !== 0 && !o.note) report.push(`${name}: ${o.label}: FAILED (exit ${o.code})`);
  }
  const parts = groups.map((g, i) => {
    const files = g.runs.length > 1 ? ` in ${g.runs.length} processes` : "";
    return `${g.name}: ${formatCounts(addCounts(byGroup[i]))}${files}`;
  });
  const took = formatDuration(performance.now() - t0);
  report.push(`${name}: ${formatCounts(total)} in ${took} (${parts.join("; ")})`);
  const code = outcomes.every((o) => o.code === 0) ? 0 : 1;
  return { code, total, report };
}
