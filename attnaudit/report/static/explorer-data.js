/* attnaudit attention explorer: reading the page's data, numbers as the report prints them,
 * colour scales. Plain JavaScript, no dependencies; the UI is in explorer.js.
 *
 * Data format (attnaudit/report/explorer.py writes it): per example, views; per view,
 * shape [layers, heads, queries, keys], token labels, site names and measures by name,
 * each {heads, encoding: "f32" (base64 little-endian float32) | "u8" (base64 bytes, value =
 * lo[map] + q * step[map], q = 255 missing; map = layer * heads + head), data}. A view
 * with a long key axis also has `long`: {block, k, tokens, index (base64 int32), value,
 * first, sink (base64 float32 or null)}, its exact kept keys (explorer.py). */
(function (global) {
  "use strict";

  function bytes(b64) {
    const text = global.atob(b64);
    const out = new Uint8Array(text.length);
    for (let i = 0; i < text.length; i += 1) out[i] = text.charCodeAt(i);
    return out;
  }

  /* One measure of a view as a plain Float64Array in C order (layers, heads, Q, K). */
  function decodeMeasure(measure, shape) {
    const raw = bytes(measure.data);
    const [layers, , queries, keys] = shape;
    const size = layers * measure.heads * queries * keys;
    const values = new Float64Array(size);
    if (measure.encoding === "f32") {
      const view = new DataView(raw.buffer);
      for (let i = 0; i < size; i += 1) values[i] = view.getFloat32(4 * i, true);
    } else {
      const cells = queries * keys;
      for (let i = 0; i < size; i += 1) {
        const map = Math.floor(i / cells);
        values[i] = raw[i] === 255 ? NaN : measure.lo[map] + raw[i] * measure.step[map];
      }
    }
    return {heads: measure.heads, encoding: measure.encoding, values: values,
            shape: [layers, measure.heads, queries, keys]};
  }

  /* A view's kept keys: positions (Int32Array), weights, key-0 and sink weights
   * (Float64Array, from float32), C order (layers, heads, queries, k) and (..., queries). */
  function decodeLong(long) {
    const floats = (b64) => {
      const raw = bytes(b64), view = new DataView(raw.buffer), out = new Float64Array(raw.length / 4);
      for (let i = 0; i < out.length; i += 1) out[i] = view.getFloat32(4 * i, true);
      return out;
    };
    const raw = bytes(long.index), view = new DataView(raw.buffer);
    const index = new Int32Array(raw.length / 4);
    for (let i = 0; i < index.length; i += 1) index[i] = view.getInt32(4 * i, true);
    return {block: long.block, k: long.k, index: index, value: floats(long.value),
            first: floats(long.first), sink: long.sink ? floats(long.sink) : null};
  }

  /* A bool array packed most significant bit first, as numpy.packbits writes it. */
  function decodeBits(packed) {
    if (!packed) return null;
    const raw = bytes(packed.bits);
    const size = packed.shape.reduce((a, b) => a * b, 1);
    const out = new Uint8Array(size);
    for (let i = 0; i < size; i += 1) out[i] = (raw[i >> 3] >> (7 - (i & 7))) & 1;
    return {shape: packed.shape, values: out};
  }

  /* A number as Python's format(value, ".4g") writes it (the report's tables and CSV
   * comparisons use it): 4 significant digits, rounded half to even on the exact binary
   * value, trailing zeros dropped, exponent form below 1e-4 and from 1e4. */
  function formatValue(value) {
    if (Number.isNaN(value)) return "nan";
    if (!Number.isFinite(value)) return value > 0 ? "inf" : "-inf";
    if (value === 0) return Object.is(value, -0) ? "-0" : "0";
    const sign = value < 0 ? "-" : "";
    const [mantissa, exponent] = Math.abs(value).toExponential(40).split("e");
    let power = parseInt(exponent, 10);
    const digits = mantissa.replace(".", "");
    const rest = digits.slice(4);
    let kept = parseInt(digits.slice(0, 4), 10);
    const up = rest[0] > "5" || (rest[0] === "5" && (/[1-9]/.test(rest.slice(1)) || kept % 2 === 1));
    if (up) kept += 1;
    if (kept === 10000) { kept = 1000; power += 1; }
    const d = String(kept);
    if (power < -4 || power >= 4) {
      const m = (d[0] + "." + d.slice(1)).replace(/\.?0+$/, "");
      return sign + m + "e" + (power < 0 ? "-" : "+") + String(Math.abs(power)).padStart(2, "0");
    }
    let text = power >= 0 ? d.slice(0, power + 1) + "." + d.slice(power + 1)
      : "0." + "0".repeat(-power - 1) + d;
    text = text.replace(/0+$/, "").replace(/\.$/, "");
    return sign + text;
  }

  const VIRIDIS = [[68, 1, 84], [72, 40, 120], [62, 74, 137], [49, 104, 142], [38, 130, 142],
    [31, 158, 137], [53, 183, 121], [109, 205, 89], [180, 222, 44], [253, 231, 37]];
  const DIVERGING = [[33, 102, 172], [103, 169, 207], [209, 229, 240], [247, 247, 247],
    [253, 219, 199], [239, 138, 98], [178, 24, 43]];

  function ramp(stops, t) {
    const x = Math.min(1, Math.max(0, t)) * (stops.length - 1);
    const i = Math.min(stops.length - 2, Math.floor(x));
    const f = x - i;
    return stops[i].map((c, j) => Math.round(c + f * (stops[i + 1][j] - c)));
  }

  /* A colour scale spanning finite values: [0, max] (viridis) or, with negative values,
   * [-m, m] (blue-white-red); [0, 1] when none is finite. */
  function spanScale(values) {
    let lo = Infinity, hi = -Infinity;
    for (const v of values) {
      if (Number.isFinite(v)) { if (v < lo) lo = v; if (v > hi) hi = v; }
    }
    if (!Number.isFinite(lo)) return {lo: 0, hi: 1, diverging: false};
    if (lo < 0) {
      const m = Math.max(-lo, hi, 1e-12);
      return {lo: -m, hi: m, diverging: true};
    }
    return {lo: 0, hi: Math.max(hi, 1e-12), diverging: false};
  }

  /* The fixed colour scale of one measure: weights on [0, 1], any other measure spanning
   * all its values (spanScale). */
  function scaleFor(name, values) {
    return name === "weights" ? {lo: 0, hi: 1, diverging: false} : spanScale(values);
  }

  function colour(scale, value) {
    if (!Number.isFinite(value)) return [255, 255, 255];
    const t = (value - scale.lo) / (scale.hi - scale.lo);
    return ramp(scale.diverging ? DIVERGING : VIRIDIS, t);
  }

  global.AttnauditExplorer = Object.assign(global.AttnauditExplorer || {}, {
    decodeMeasure: decodeMeasure, decodeBits: decodeBits, decodeLong: decodeLong, formatValue: formatValue,
    scaleFor: scaleFor, spanScale: spanScale, colour: colour
  });
})(window);
