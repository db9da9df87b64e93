/**
 * Llama 3 RoPE scaling from a GGUF file. llama.cpp's converter does not store the `rope_scaling`
 * parameters of a Llama 3.1-style model: it stores their effect, a `rope_freqs.weight` tensor of
 * D/2 f32 factors (wavelengths are multiplied by them; `LlamaModel.generate_extra_tensors`). This
 * recovers parameters that reproduce those factors, so the config stays a {@linkcode
 * Llama3RopeScaling} and `ropeInvFreq` stays the one place frequencies are computed.
 *
 * The factors depend on the parameters only through the two wavelength thresholds
 * `Lw = original / low_freq_factor` and `Hw = original / high_freq_factor` and on `factor`: a
 * dimension with wavelength w has factor 1 when w < Hw, `factor` when w > Lw, and in between
 * 1 / ((1 − s) / factor + s) with s = (1/w − 1/Lw) / (1/Hw − 1/Lw), linear in 1/w. So with
 * low_freq_factor fixed at 1 (original = Lw), two or more "medium" dimensions determine Lw and
 * Hw by a straight-line fit; with fewer, any thresholds in the gaps between the dimensions'
 * wavelengths reproduce the factors, and one is chosen. Either way the result is checked by
 * recomputing every factor.
 */
import type { Llama3RopeScaling } from "./config.ts";

/** What {@linkcode fitLlama3Scaling} needs besides the factors. */
export interface RopeFreqsShape {
  headDim: number;
  ropeTheta: number;
  /** For error messages. */
  path: string;
}

/** Relative agreement required between the stored factors and the fitted parameters' factors. */
const TOLERANCE = 1e-4;

/**
 * Llama 3 scaling parameters that reproduce `factors` (one per rotated pair, D/2 of them).
 *
 * @returns the parameters, or undefined when every factor is 1 (no scaling)
 * @throws naming the file when the factors are not Llama 3 scaling
 */
export function fitLlama3Scaling(
  factors: Float32Array,
  shape: RopeFreqsShape,
): Llama3RopeScaling | undefined {
  const { headDim: D, ropeTheta, path } = shape;
  const refuse = (why: string) =>
    new Error(
      `rope_freqs.weight in ${path} ${why}; strata reads Llama 3 RoPE scaling (what ` +
        `llama.cpp's converter writes for rope_type 'llama3') or none`,
    );
  if (factors.length !== D / 2) {
    throw refuse(`has ${factors.length} factors, but the head dimension ${D} needs ${D / 2}`);
  }
  const wavelen = ropeWavelengths(D, ropeTheta);
  const f = Array.from(factors);
  const factor = Math.max(...f);
  if (!(factor >= 1) || f.some((x) => !(x >= 1 - TOLERANCE))) {
    throw refuse(`holds factors below 1 (${f.join(", ")})`);
  }
  if (factor <= 1 + TOLERANCE) return undefined;
  const near = (a: number, b: number) => Math.abs(a - b) <= TOLERANCE * Math.abs(b);
  const kind = f.map((x) => (near(x, 1) ? "high" : near(x, factor) ? "low" : "medium"));
  const medium = kind.flatMap((k, i) => (k === "medium" ? [i] : []));
  let [lw, hw] = [NaN, NaN];
  if (medium.length >= 2) {
    // s = k/w − k/Lw with k = 1/(1/Hw − 1/Lw): a line in 1/w, slope k, intercept −k/Lw; and
    // s = 1 at w = Hw.
    const xs = medium.map((i) => 1 / wavelen[i]);
    const ss = medium.map((i) => (factor / f[i] - 1) / (factor - 1));
    const [slope, intercept] = lineFit(xs, ss);
    lw = -slope / intercept;
    hw = slope / (1 - intercept);
  } else {
    const lastHigh = kind.lastIndexOf("high"), firstLow = kind.indexOf("low");
    const wHigh = lastHigh >= 0 ? wavelen[lastHigh] : wavelen[0] / 4;
    const wLow = firstLow >= 0 ? wavelen[firstLow] : wavelen[D / 2 - 1] * 4;
    if (medium.length === 1) {
      const i = medium[0], s = (factor / f[i] - 1) / (factor - 1);
      lw = Math.sqrt(wavelen[i] * wLow);
      hw = 1 / (1 / lw + (1 / wavelen[i] - 1 / lw) / s);
    } else {
      lw = wHigh ** (1 / 3) * wLow ** (2 / 3);
      hw = wHigh ** (2 / 3) * wLow ** (1 / 3);
    }
  }
  const original = roundIfNear(lw), high = roundIfNear(lw / hw);
  const scaling: Llama3RopeScaling = {
    type: "llama3",
    factor: roundIfNear(factor),
    lowFreqFactor: 1,
    highFreqFactor: high,
    originalMaxPositions: original,
  };
  if (!(high > 1) || !(original > 0)) throw refuse("does not follow Llama 3's shape");
  const again = llama3Factors(scaling, wavelen);
  const bad = again.findIndex((x, i) => !near(x, f[i]));
  if (bad >= 0) {
    throw refuse(
      `does not follow Llama 3's shape (factor ${bad} is ${f[bad]}; the closest Llama 3 ` +
        `parameters give ${again[bad]})`,
    );
  }
  return scaling;
}

/**
 * The factors llama.cpp's converter writes for Llama 3 scaling (`generate_extra_tensors`), for
 * dimensions of wavelengths `wavelen`. The writer and the fit's check share it.
 */
export function llama3Factors(s: Llama3RopeScaling, wavelen: number[]): number[] {
  const lowWavelen = s.originalMaxPositions / s.lowFreqFactor;
  const highWavelen = s.originalMaxPositions / s.highFreqFactor;
  return wavelen.map((w) => {
    if (w < highWavelen) return 1;
    if (w > lowWavelen) return s.factor;
    const smooth = (s.originalMaxPositions / w - s.lowFreqFactor) /
      (s.highFreqFactor - s.lowFreqFactor);
    return 1 / ((1 - smooth) / s.factor + smooth);
  });
}

/** Wavelengths 2π · θ^(2i/D) of a head's D/2 rotated pairs. */
export function ropeWavelengths(headDim: number, ropeTheta: number): number[] {
  return Array.from(
    { length: headDim / 2 },
    (_, i) => 2 * Math.PI * ropeTheta ** (2 * i / headDim),
  );
}

/** The least-squares line through (xs, ys): [slope, intercept]. */
function lineFit(xs: number[], ys: number[]): [number, number] {
  const n = xs.length;
  const mx = xs.reduce((s, x) => s + x, 0) / n, my = ys.reduce((s, y) => s + y, 0) / n;
  let sxy = 0, sxx = 0;
  for (let i = 0; i < n; i++) {
    sxy += (xs[i] - mx) * (ys[i] - my);
    sxx += (xs[i] - mx) ** 2;
  }
  const slope = sxy / sxx;
  return [slope, my - slope * mx];
}

/** x rounded to an integer when it is one up to float32 noise. */
function roundIfNear(x: number): number {
  const r = Math.round(x);
  return Math.abs(x - r) <= 1e-3 * Math.max(1, Math.abs(r)) ? r : x;
}
