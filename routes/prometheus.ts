/**
 * A small Prometheus registry: counters, gauges and histograms rendered in the text exposition
 * format 0.0.4. Enough for /metrics, nothing more.
 */

/** Label names to values. */
export type Labels = Record<string, string>;

/** One line of output: a series' labels and value (histograms add a name suffix). */
export interface Sample {
  labels: Labels;
  value: number;
  suffix?: string;
}

function escapeLabel(value: string): string {
  return value.replaceAll("\\", "\\\\").replaceAll("\n", "\\n").replaceAll('"', '\\"');
}

function formatLabels(labels: Labels): string {
  const parts = Object.entries(labels).map(([k, v]) => `${k}="${escapeLabel(v)}"`);
  return parts.length ? `{${parts.join(",")}}` : "";
}

function formatValue(value: number): string {
  if (value === Infinity) return "+Inf";
  if (value === -Infinity) return "-Inf";
  return Number.isNaN(value) ? "NaN" : String(value);
}

function keyOf(labels: Labels): string {
  return JSON.stringify(Object.entries(labels).sort(([a], [b]) => (a < b ? -1 : 1)));
}

interface Metric {
  name: string;
  help: string;
  type: "counter" | "gauge" | "histogram";
  samples(): Sample[];
}

/** A monotonically increasing count, optionally split by labels. */
export class Counter implements Metric {
  readonly type = "counter";
  #values = new Map<string, Sample>();
  /**
   * @param name metric name ending in `_total`; @param help one-line description
   * @param collect when given, the samples are read from it at scrape time (a count kept
   *   elsewhere) instead of from `inc`
   */
  constructor(
    readonly name: string,
    readonly help: string,
    readonly collect?: () => Sample[],
  ) {}
  /** Adds `value` (default 1) to the series with these labels. */
  inc(labels: Labels = {}, value = 1): void {
    const key = keyOf(labels);
    const s = this.#values.get(key);
    if (s) s.value += value;
    else this.#values.set(key, { labels, value });
  }
  /** Current value of one series (0 when never incremented). */
  get(labels: Labels = {}): number {
    return this.#values.get(keyOf(labels))?.value ?? 0;
  }
  /** All series. */
  samples(): Sample[] {
    return this.collect ? this.collect() : [...this.#values.values()];
  }
}

/** A value read at scrape time from a callback. */
export class Gauge implements Metric {
  readonly type = "gauge";
  /** @param collect returns the current samples when /metrics is scraped */
  constructor(readonly name: string, readonly help: string, readonly collect: () => Sample[]) {}
  /** Samples from the callback. */
  samples(): Sample[] {
    return this.collect();
  }
}

/** Observations counted into cumulative buckets, with their sum and count. */
export class Histogram implements Metric {
  readonly type = "histogram";
  #counts: number[];
  #sum = 0;
  #count = 0;
  /** @param buckets upper bounds, ascending (the `+Inf` bucket is implied) */
  constructor(readonly name: string, readonly help: string, readonly buckets: number[]) {
    this.#counts = new Array(buckets.length).fill(0);
  }
  /** Records one observation. */
  observe(value: number): void {
    for (let i = 0; i < this.buckets.length; i++) if (value <= this.buckets[i]) this.#counts[i]++;
    this.#sum += value;
    this.#count++;
  }
  /** Number of observations so far. */
  get count(): number {
    return this.#count;
  }
  /** Bucket, sum and count lines. */
  samples(): Sample[] {
    const out: Sample[] = this.buckets.map((le, i) => ({
      suffix: "_bucket",
      labels: { le: formatValue(le) },
      value: this.#counts[i],
    }));
    out.push({ suffix: "_bucket", labels: { le: "+Inf" }, value: this.#count });
    out.push({ suffix: "_sum", labels: {}, value: this.#sum });
    out.push({ suffix: "_count", labels: {}, value: this.#count });
    return out;
  }
}

/**
 * Holds metrics and renders them.
 *
 * @example
 * ```ts
 * const r = new Registry();
 * const hits = r.add(new Counter("hits_total", "Hits."));
 * hits.inc({ route: "/" });
 * r.render(); // "# HELP hits_total Hits.\n# TYPE hits_total counter\nhits_total{route=\"/\"} 1\n"
 * ```
 */
export class Registry {
  #metrics: Metric[] = [];
  /** Registers `metric` and returns it. */
  add<M extends Metric>(metric: M): M {
    if (this.#metrics.some((m) => m.name === metric.name)) {
      throw new Error(`internal error: metric ${metric.name} registered twice`);
    }
    this.#metrics.push(metric);
    return metric;
  }
  /** The text exposition format (`text/plain; version=0.0.4`). */
  render(): string {
    const lines: string[] = [];
    for (const m of this.#metrics) {
      lines.push(`# HELP ${m.name} ${m.help}`, `# TYPE ${m.name} ${m.type}`);
      for (const s of m.samples()) {
        lines.push(`${m.name}${s.suffix ?? ""}${formatLabels(s.labels)} ${formatValue(s.value)}`);
      }
    }
    return lines.join("\n") + "\n";
  }
}
