/* attnaudit attention explorer: the interactive view of a report's (or a notebook's)
 * attention maps. Plain JavaScript, no dependencies, no network; reads the JSON in each
 * .ax-explorer element (explorer-data.js decodes it) and draws a model view (layers x heads
 * grid of small maps) or a head view (one map with token labels and the lines from the
 * current step to every key). It opens where the page data's `opening` says (explorer.py
 * chooses it), each map coloured from 0 to its own maximum unless the colour scale is set
 * to fixed. Keyboard: Tab through the controls; on the map, arrows move
 * the step and key (head view) or the layer and head (model view, Enter opens the head),
 * Page Up / Page Down move 10 steps, Home / End the first and last key.
 *
 * A view with a long key axis (`long` in its data: a long prompt) draws block means; the
 * head view zooms into one block at token resolution (the zoom control, "Zoom into block",
 * or Enter on the map; Escape or "All blocks" goes back): a kept key (a row's top keys and
 * key 0) shows its exact weight, outlined, every other key the block mean, and the readout
 * says which it is. */
(function (global) {
  "use strict";
  const X = global.AttnauditExplorer;
  const WINDOW = 256;  // queries and keys drawn at once; longer sequences scroll
  const MEAN = "mean";
  let counter = 0;

  function el(tag, attrs, children) {
    const node = document.createElement(tag);
    for (const [k, v] of Object.entries(attrs || {})) {
      if (k === "text") node.textContent = v; else node.setAttribute(k, v);
    }
    for (const c of children || []) node.appendChild(c);
    return node;
  }

  function labelled(text, control) {
    return el("label", {class: "ax-field"}, [el("span", {text: text}), control]);
  }

  function options(select, items, selected) {
    select.replaceChildren(...items.map(([value, text]) => el("option", {value: value, text: text})));
    select.value = String(selected);
  }

  function Explorer(root, data) {
    this.root = root;
    this.data = data;
    this.cache = new Map();
    const o = data.opening || {};
    this.state = {example: o.example || 0, view: o.view || 0, measure: "weights", mode: "head",
                  layer: o.layer || 0, head: o.head || 0, step: o.step || 0, key: o.key || 0,
                  qStart: 0, kStart: 0, scale: "map", zoom: null};
    this.hover = null;
    this.build();
    this.select({});
  }

  Explorer.prototype.build = function () {
    const id = "ax" + (counter += 1);
    const c = this.controls = {
      example: el("select", {class: "ax-example"}), view: el("select", {class: "ax-view"}),
      measure: el("select", {class: "ax-measure"}), scale: el("select", {class: "ax-scale"}),
      layer: el("select", {class: "ax-layer"}),
      head: el("select", {class: "ax-head"}),
      step: el("input", {type: "range", class: "ax-step", min: "0", value: "0"}),
      stepText: el("output", {class: "ax-step-text"}),
      qStart: el("input", {type: "range", class: "ax-qstart", min: "0", value: "0"}),
      kStart: el("input", {type: "range", class: "ax-kstart", min: "0", value: "0"}),
      model: el("button", {type: "button", class: "ax-mode-model", text: "Model view"}),
      headMode: el("button", {type: "button", class: "ax-mode-head", text: "Head view"}),
      zoom: el("select", {class: "ax-zoom"}),
      zoomIn: el("button", {type: "button", class: "ax-zoom-in", text: "Zoom into block"}),
      zoomOut: el("button", {type: "button", class: "ax-zoom-out", text: "All blocks"}),
      png: el("button", {type: "button", class: "ax-export-png", text: "Export PNG"}),
      svg: el("button", {type: "button", class: "ax-export-svg", text: "Export SVG"})
    };
    this.stepLabel = el("span", {text: "Step"});
    this.windowFields = el("div", {class: "ax-window", hidden: ""}, [
      labelled("Queries from", c.qStart), labelled("Keys from", c.kStart)]);
    const stepField = el("label", {class: "ax-field ax-step-field"}, [this.stepLabel, c.step, c.stepText]);
    const modes = el("div", {class: "ax-modes", role: "group", "aria-label": "View"}, [c.model, c.headMode]);
    const exports = el("div", {class: "ax-exports", role: "group", "aria-label": "Export"}, [c.png, c.svg]);
    this.zoomFields = el("div", {class: "ax-zooming", role: "group", "aria-label": "Key blocks", hidden: ""}, [
      labelled("Keys", c.zoom), c.zoomIn, c.zoomOut]);
    this.canvas = el("canvas", {class: "ax-canvas", tabindex: "0", role: "application",
      "aria-roledescription": "attention map"});
    this.readout = el("output", {class: "ax-readout", id: id + "-readout", "aria-live": "polite"});
    this.canvas.setAttribute("aria-describedby", id + "-readout");
    this.tooltip = el("div", {class: "ax-tooltip", "aria-hidden": "true", hidden: ""});
    this.legend = el("p", {class: "ax-legend"});
    this.opened = el("p", {class: "ax-opened"});
    this.root.append(
      el("div", {class: "ax-controls"}, [labelled("Example", c.example), labelled("Attention", c.view),
        labelled("Measure", c.measure), labelled("Colour scale", c.scale), modes, labelled("Layer", c.layer), labelled("Head", c.head),
        stepField, this.zoomFields, this.windowFields, exports]),
      this.figure = el("div", {class: "ax-figure"}, [this.canvas, this.tooltip]), this.readout, this.legend,
      this.opened);
    options(c.example, this.data.examples.map((e, i) => [i, "#" + e.index + ": " + e.source]), this.state.example);
    c.example.addEventListener("change", () => this.select({example: +c.example.value, view: 0}));
    c.view.addEventListener("change", () => this.select({view: +c.view.value}));
    c.measure.addEventListener("change", () => this.select({measure: c.measure.value}));
    c.scale.addEventListener("change", () => this.select({scale: c.scale.value}));
    c.layer.addEventListener("change", () => this.select({layer: this.pick(c.layer.value)}));
    c.head.addEventListener("change", () => this.select({head: this.pick(c.head.value)}));
    c.step.addEventListener("input", () => this.select({step: +c.step.value}));
    c.qStart.addEventListener("input", () => this.select({qStart: +c.qStart.value}));
    c.kStart.addEventListener("input", () => this.select({kStart: +c.kStart.value}));
    c.model.addEventListener("click", () => this.select({mode: "model"}));
    c.headMode.addEventListener("click", () => this.select({mode: "head"}));
    c.zoom.addEventListener("change", () => this.zoomTo(c.zoom.value === "" ? null : +c.zoom.value));
    c.zoomIn.addEventListener("click", () => this.zoomTo(this.state.key));  // the overview's keys are blocks
    c.zoomOut.addEventListener("click", () => this.zoomTo(null));
    c.png.addEventListener("click", () => this.download("png"));
    c.svg.addEventListener("click", () => this.download("svg"));
    this.canvas.addEventListener("keydown", (e) => this.key(e));
    this.canvas.addEventListener("mousemove", (e) => this.pointer(e));
    this.canvas.addEventListener("mouseleave", () => { this.hover = null; this.tooltip.hidden = true; this.describe(); });
    this.canvas.addEventListener("click", (e) => this.pointer(e, true));
    this.describeOpening();
    if (global.ResizeObserver) {
      let width = 0;
      new global.ResizeObserver(() => {
        if (this.root.clientWidth !== width) { width = this.root.clientWidth; this.draw(); }
      }).observe(this.root);
    }
  };

  Explorer.prototype.pick = function (value) { return value === MEAN ? MEAN : +value; };

  /* The current view as the page data holds it. */
  Explorer.prototype.baseView = function () {
    return this.data.examples[this.state.example].views[this.state.view];
  };

  /* The current view: the page data's, or, zoomed into a block of a long key axis, that
   * block at token resolution (made once per block and kept). */
  Explorer.prototype.view = function () {
    const base = this.baseView();
    const z = this.state.zoom;
    if (z === null || !base.long) return base;
    const decoded = this.decoded(base);
    decoded.zooms = decoded.zooms || new Map();
    if (!decoded.zooms.has(z)) {
      const [layers, heads, queries] = base.shape, block = base.long.block;
      const start = z * block, stop = Math.min(base.long.tokens.length, start + block);
      decoded.zooms.set(z, {name: base.name, role: base.role, title: base.title, query_axis: base.query_axis,
        sites: base.sites, queries: base.queries, keys: base.long.tokens.slice(start, stop),
        axes: [base.axes[0], base.axes[1] + " " + start + "\u2013" + (stop - 1) + " (block " + z + ")"],
        shape: [layers, heads, queries, stop - start], measures: {weights: null}, ineligible: null,
        masked_cells: [], failing_rows: base.failing_rows, long: null,
        zoom: {base: base, block: z, start: start, stop: stop}});
    }
    return decoded.zooms.get(z);
  };

  /* The weights of a zoomed block (see view()): every key the block mean, kept keys
   * (top keys and key 0 of each row) their exact weight, marked in `kept`. */
  Explorer.prototype.zoomMeasure = function (view) {
    const z = view.zoom, base = z.base;
    const means = this.decoded(base).measures.weights || X.decodeMeasure(base.measures.weights, base.shape);
    const decoded = this.decoded(base);
    decoded.long = decoded.long || X.decodeLong(base.long);
    const long = decoded.long;
    const [layers, heads, queries, blocks] = means.shape, n = z.stop - z.start;
    const values = new Float64Array(layers * heads * queries * n), kept = new Uint8Array(values.length);
    for (let row = 0; row < layers * heads * queries; row += 1) {
      const mean = means.values[row * blocks + z.block];
      for (let k = 0; k < n; k += 1) values[row * n + k] = mean;
      if (z.start === 0) { values[row * n] = long.first[row]; kept[row * n] = 1; }
      for (let r = 0; r < long.k; r += 1) {
        const key = long.index[row * long.k + r];
        if (key >= z.start && key < z.stop) {
          values[row * n + key - z.start] = long.value[row * long.k + r];
          kept[row * n + key - z.start] = 1;
        }
      }
    }
    return {heads: heads, encoding: means.encoding, values: values, kept: kept, shape: [layers, heads, queries, n]};
  };

  /* Zoom into block `block` of the current long view (null: back to every block). */
  Explorer.prototype.zoomTo = function (block) {
    const s = this.state, view = this.baseView();
    if (!view.long) return;
    const key = block === null ? (s.zoom === null ? s.key : s.zoom) : 0;
    this.hover = null;
    this.select({zoom: block, key: key, measure: "weights"});
  };

  /* The decoded measure of the current view (decoded once, on first use, and kept with
   * the view). */
  Explorer.prototype.measure = function (name) {
    const view = this.view();
    const decoded = this.decoded(view);
    if (!decoded.measures[name]) {
      const m = view.zoom ? this.zoomMeasure(view) : X.decodeMeasure(view.measures[name], view.shape);
      m.scale = X.scaleFor(name, m.values);
      m.maps = new Map();
      decoded.measures[name] = m;
    }
    return decoded.measures[name];
  };

  /* The colour scale of one (layer, head) map (either may be MEAN) of the current
   * measure: from 0 (or -max) to the map's maximum over all its queries and keys, or the
   * measure's fixed scale. */
  Explorer.prototype.scale = function (layer, head) {
    const m = this.measure(this.state.measure);
    if (this.state.scale === "fixed") return m.scale;
    const id = layer + "," + head;
    if (!m.maps.has(id)) {
      const [, , queries, keys] = m.shape;
      const values = new Float64Array(queries * keys);
      for (let q = 0; q < queries; q += 1) {
        for (let k = 0; k < keys; k += 1) values[q * keys + k] = this.value(layer, head, q, k);
      }
      m.maps.set(id, X.spanScale(values));
    }
    return m.maps.get(id);
  };

  /* The sentence under the map saying where the page opened, and why. */
  Explorer.prototype.describeOpening = function () {
    const o = this.data.opening;
    if (!o) return;
    const example = this.data.examples[o.example], view = example.views[o.view];
    this.opened.textContent = "Opened on example #" + example.index + ", " + view.title + ", layer " + o.layer +
      " (" + view.sites[o.layer] + "), head " + o.head + ": " + o.reason + ".";
    Object.assign(this.opened.dataset, {example: example.index, view: view.name, layer: o.layer, head: o.head,
      statistic: o.statistic || "", value: o.value === undefined || o.value === null ? "" : String(o.value)});
  };

  Explorer.prototype.decoded = function (view) {
    if (!this.cache.has(view)) this.cache.set(view, {measures: {}, ineligible: null});
    return this.cache.get(view);
  };

  Explorer.prototype.select = function (change) {
    const s = Object.assign(this.state, change);
    const c = this.controls;
    const views = this.data.examples[s.example].views;
    if ("view" in change || "example" in change) s.zoom = null;
    s.view = Math.min(s.view, views.length - 1);
    options(c.view, views.map((v, i) => [i, v.title]), s.view);
    const base = this.baseView();
    if (!base.long) s.zoom = null;
    this.zoomFields.hidden = !base.long;
    if (base.long) {
      options(c.zoom, [["", "every block (means of " + base.long.block + " tokens)"],
        ...base.keys.map((label, i) => [i, "block " + i + ": " + label])], s.zoom === null ? "" : s.zoom);
      c.zoomOut.disabled = s.zoom === null;
      c.zoomIn.disabled = s.zoom !== null;
    }
    const view = this.view();
    const names = Object.keys(view.measures);
    if (!names.includes(s.measure)) s.measure = names[0];
    options(c.measure, names.map((n) => [n, n]), s.measure);
    options(c.scale, [["map", "0 to each map's maximum"],
      ["fixed", s.measure === "weights" ? "fixed, 0 to 1" : "fixed, the measure's range"]], s.scale);
    const [layers, heads, queries, keys] = view.shape;
    const mheads = this.measure(s.measure).heads;
    s.layer = s.layer === MEAN && layers > 1 ? MEAN : Math.min(s.layer === MEAN ? 0 : s.layer, layers - 1);
    s.head = s.head === MEAN && mheads > 1 ? MEAN : Math.min(s.head === MEAN ? 0 : s.head, mheads - 1);
    options(c.layer, [...view.sites.map((site, i) => [i, i + ": " + site]),
      ...(layers > 1 ? [[MEAN, "mean over layers"]] : [])], s.layer);
    options(c.head, [...Array.from({length: mheads}, (_, i) => [i, String(i)]),
      ...(mheads > 1 ? [[MEAN, "mean over heads"]] : [])], s.head);
    s.step = Math.min(s.step, queries - 1);
    s.key = Math.min(s.key, keys - 1);
    c.step.max = String(queries - 1);
    c.step.value = String(s.step);
    c.step.setAttribute("aria-valuetext", this.tokenText(view.queries, s.step));
    this.stepLabel.textContent = view.query_axis;
    c.stepText.textContent = s.step + " / " + (queries - 1) + " " + this.tokenText(view.queries, s.step);
    if (!("qStart" in change)) s.qStart = this.follow(s.qStart, s.step, queries);
    if (!("kStart" in change)) s.kStart = this.follow(s.kStart, s.key, keys);
    this.windowFields.hidden = queries <= WINDOW && keys <= WINDOW;
    for (const [input, n, at] of [[c.qStart, queries, s.qStart], [c.kStart, keys, s.kStart]]) {
      input.max = String(Math.max(0, n - WINDOW));
      input.value = String(at);
      input.disabled = n <= WINDOW;
    }
    c.model.setAttribute("aria-pressed", String(s.mode === "model"));
    c.headMode.setAttribute("aria-pressed", String(s.mode === "head"));
    this.draw();
    this.describe();
  };

  /* A window start that keeps index i in view. */
  Explorer.prototype.follow = function (start, i, n) {
    if (n <= WINDOW) return 0;
    if (i < start) return i;
    if (i >= start + WINDOW) return i - WINDOW + 1;
    return Math.min(start, n - WINDOW);
  };

  Explorer.prototype.tokenText = function (labels, i) { return "\u201c" + labels[i] + "\u201d"; };

  /* The value of a cell of the current measure at a layer and head (or their means). */
  Explorer.prototype.value = function (layer, head, q, k) {
    const m = this.measure(this.state.measure);
    const [layers, heads, queries, keys] = m.shape;
    if (layer !== MEAN && head !== MEAN) {
      return m.values[((layer * heads + Math.min(head, heads - 1)) * queries + q) * keys + k];
    }
    const ls = layer === MEAN ? [...Array(layers).keys()] : [layer];
    const hs = head === MEAN ? [...Array(heads).keys()] : [Math.min(head, heads - 1)];
    let sum = 0;
    for (const l of ls) for (const h of hs) sum += m.values[((l * heads + h) * queries + q) * keys + k];
    return sum / (ls.length * hs.length);
  };

  Explorer.prototype.flags = function (layer, head, q, k) {
    const view = this.view();
    const out = [];
    const one = (l, h) => {
      for (const cell of view.masked_cells) {
        if (cell[0] === l && cell[1] === h && cell[2] === q && cell[3] === k) out.push("ineligible key received weight");
      }
      for (const row of view.failing_rows) {
        if (row.layer === l && row.head === h && row.query === q) {
          out.push("row fails the " + row.checks.join(" and ") + " check (sum " +
            X.formatValue(row.row_sum === null ? NaN : row.row_sum) + ", masked mass " +
            X.formatValue(row.masked_mass === null ? NaN : row.masked_mass) + ")");
        }
      }
    };
    if (layer !== MEAN && head !== MEAN) one(layer, head);
    return [...new Set(out)];
  };

  Explorer.prototype.ineligible = function (layer, head, q, k) {
    const view = this.view();
    if (!view.ineligible || layer === MEAN || head === MEAN) return false;
    const decoded = this.decoded(view);
    decoded.ineligible = decoded.ineligible || X.decodeBits(view.ineligible);
    const b = decoded.ineligible;
    const [, heads, queries, keys] = b.shape;
    return b.values[((layer * heads + head) * queries + q) * keys + k] === 1;
  };

  /* The readout (and its screen-reader announcement) for a cell: the hovered one, else
   * the current step and key of the current layer and head. */
  Explorer.prototype.describe = function () {
    const s = this.state;
    const view = this.view();
    const cell = this.hover || {layer: s.layer, head: s.head, q: s.step, k: s.key};
    const v = this.value(cell.layer, cell.head, cell.q, cell.k);
    const mheads = this.measure(s.measure).heads;
    const where = (cell.layer === MEAN ? "mean over layers" : "layer " + cell.layer + " (" + view.sites[cell.layer] + ")") +
      ", " + (mheads === 1 ? "one map per layer" : cell.head === MEAN ? "mean over heads" : "head " + cell.head);
    const approximate = this.measure(s.measure).encoding === "u8" ? "\u2248" : "";
    const mean = cell.layer === MEAN || cell.head === MEAN;
    const kind = this.cellKind(cell);
    const key = view.zoom ? view.zoom.start + cell.k : cell.k;
    const text = s.measure + " " + approximate + X.formatValue(v) + (mean ? " (mean computed here)" : "") +
      (kind ? " (" + kind + ")" : "") +
      "; query " + cell.q + " " + this.tokenText(view.queries, cell.q) + " \u2192 " + (this.baseView().long && !view.zoom ? "block " : "key ") + key + " " +
      this.tokenText(view.keys, cell.k) + "; " + where + "; " + view.title + ", example #" +
      this.data.examples[s.example].index + ".";
    const flags = this.flags(cell.layer, cell.head, cell.q, cell.k);
    this.readout.textContent = text + (flags.length ? " Finding: " + flags.join("; ") + "." : "");
    Object.assign(this.readout.dataset, {value: X.formatValue(v), exact: String(v), layer: cell.layer, head: cell.head,
      query: cell.q, key: key, kind: kind, block: view.zoom ? view.zoom.block : this.baseView().long ? cell.k : "",
      measure: s.measure, view: view.name,
      example: this.data.examples[s.example].index, flags: flags.length});
    this.canvas.setAttribute("aria-label", (s.mode === "model" ? "Model view: " : "Head view: ") + view.title + ", " +
      s.measure + ", " + view.shape[0] + " layers by " + view.shape[1] + " heads, " + view.shape[2] +
      " queries by " + view.shape[3] + " keys; rows: " + view.axes[0] + ", columns: " + view.axes[1] + ". Arrow keys move the selection; the value is read out below.");
    return text;
  };

  /* What a cell of a long view holds: a block mean (the overview), and zoomed, a kept
   * key's exact weight or its block's mean; "" for an exact map. */
  Explorer.prototype.cellKind = function (cell) {
    const view = this.view();
    if (!view.zoom) return this.baseView().long ? "block mean" : "";
    if (cell.layer === MEAN || cell.head === MEAN) return "mean of exact weights and block means";
    const m = this.measure("weights");
    const [, heads, queries, n] = m.shape;
    return m.kept[((cell.layer * heads + cell.head) * queries + cell.q) * n + cell.k] ? "exact, a kept key"
      : "block mean of keys " + view.zoom.start + "\u2013" + (view.zoom.stop - 1) + ", not this key's own weight";
  };

  /* Whether a zoomed cell holds a kept key's exact weight. */
  Explorer.prototype.kept = function (layer, head, q, k) {
    const view = this.view();
    if (!view.zoom || layer === MEAN || head === MEAN) return false;
    const m = this.measure("weights");
    const [, heads, queries, n] = m.shape;
    return m.kept[((layer * heads + head) * queries + q) * n + k] === 1;
  };

  Explorer.prototype.key = function (event) {
    const s = this.state;
    const [layers, , queries, keys] = this.view().shape;
    const heads = this.measure(s.measure).heads;
    const change = {};
    const k = event.key;
    if (s.mode === "model") {
      const l = s.layer === MEAN ? 0 : s.layer, h = s.head === MEAN ? 0 : s.head;
      if (k === "ArrowUp") change.layer = Math.max(0, l - 1);
      else if (k === "ArrowDown") change.layer = Math.min(layers - 1, l + 1);
      else if (k === "ArrowLeft") change.head = Math.max(0, h - 1);
      else if (k === "ArrowRight") change.head = Math.min(heads - 1, h + 1);
      else if (k === "Enter" || k === " ") Object.assign(change, {mode: "head", layer: l, head: h});
    } else if (k === "ArrowUp") change.step = Math.max(0, s.step - 1);
    else if (k === "ArrowDown") change.step = Math.min(queries - 1, s.step + 1);
    else if (k === "ArrowLeft") change.key = Math.max(0, s.key - 1);
    else if (k === "ArrowRight") change.key = Math.min(keys - 1, s.key + 1);
    else if (k === "PageUp") change.step = Math.max(0, s.step - 10);
    else if (k === "PageDown") change.step = Math.min(queries - 1, s.step + 10);
    else if (k === "Home") change.key = 0;
    else if (k === "End") change.key = keys - 1;
    else if (k === "Enter" && this.baseView().long && s.zoom === null) {
      event.preventDefault();
      this.zoomTo(s.key);
      return;
    } else if (k === "Escape" && s.zoom !== null) {
      event.preventDefault();
      this.zoomTo(null);
      return;
    }
    if (!Object.keys(change).length) return;
    event.preventDefault();
    this.hover = null;
    this.select(change);
  };

  Explorer.prototype.pointer = function (event, click) {
    const box = this.canvas.getBoundingClientRect();
    const x = event.clientX - box.left, y = event.clientY - box.top;
    const hit = (this.scene ? this.scene.hits : []).find((r) => x >= r.x && x < r.x + r.w && y >= r.y && y < r.y + r.h);
    if (!hit) { this.hover = null; this.tooltip.hidden = true; this.describe(); return; }
    const q = hit.q0 + Math.floor((y - hit.y) / hit.ch), k = hit.k0 + Math.floor((x - hit.x) / hit.cw);
    if (click) {
      this.hover = null;
      this.select(this.state.mode === "model" ? {mode: "head", layer: hit.layer, head: hit.head, step: q, key: k}
        : {step: q, key: k});
      return;
    }
    this.hover = {layer: hit.layer, head: hit.head, q: q, k: k};
    this.tooltip.textContent = this.describe();
    this.tooltip.hidden = false;
    this.tooltip.style.left = Math.min(x + 14, this.canvas.clientWidth - 220) + "px";
    this.tooltip.style.top = (y + 14) + "px";
  };

  Explorer.prototype.draw = function () {
    const width = Math.max(200, this.figure.clientWidth || 640);
    this.scene = global.AttnauditExplorer.layout(this, width);
    const ratio = global.devicePixelRatio || 1;
    this.canvas.width = Math.round(this.scene.width * ratio);
    this.canvas.height = Math.round(this.scene.height * ratio);
    this.canvas.style.width = this.scene.width + "px";
    this.canvas.style.height = this.scene.height + "px";
    this.canvas.dataset.width = this.scene.width;
    this.canvas.dataset.height = this.scene.height;
    global.AttnauditExplorer.paint(this.canvas.getContext("2d"), this.scene, ratio);
    const s = this.state, m = this.measure(s.measure), scale = this.scale(s.layer, s.head);
    const range = X.formatValue(scale.lo) + " to " + X.formatValue(scale.hi);
    const selected = (s.layer === MEAN ? "the mean over layers" : "layer " + s.layer) +
      (m.heads === 1 ? "" : s.head === MEAN ? ", mean over heads" : ", head " + s.head);
    const largest = scale.diverging ? "largest magnitude" : "maximum";
    const colour = s.scale === "fixed" ? "every map from " + range + " (fixed)"
      : s.mode === "model" ? "each map on its own scale, up to its " + largest + "; " + selected + ": " + range
      : "from " + range + ", the " + largest + " of this map (" + selected + ")";
    this.legend.textContent = "Colour: " + s.measure + (s.mode === "model" ? ", " : " ") + colour +
      (m.encoding === "u8" ? " (stored with 8 bits per map: values are approximate)" : "") +
      ". Grey cells: keys the row may not attend; a red outline: an ineligible key that received weight; " +
      "a red bar left of a row: the row fails the row-sum or masked-mass check." + this.longLegend() +
      (this.data.csv ? " Every value: " + this.data.csv + "." : "");
    Object.assign(this.legend.dataset, {scale: s.scale, lo: X.formatValue(scale.lo), hi: X.formatValue(scale.hi)});
  };

  /* The legend's words on a long key axis: what the cells are, overview or zoomed. */
  Explorer.prototype.longLegend = function () {
    const base = this.baseView(), view = this.view();
    if (!base.long) return "";
    if (!view.zoom) {
      return " Keys: " + base.long.tokens.length + " tokens in blocks of " + base.long.block +
        "; each cell is the block's mean weight. Zoom into a block to read its tokens: each row's top " +
        base.long.k + " keys and key 0 are kept exactly" +
        (this.data.top_keys_csv ? " (" + this.data.top_keys_csv + ")." : ".");
    }
    return " Zoomed into block " + view.zoom.block + " (keys " + view.zoom.start + "\u2013" + (view.zoom.stop - 1) +
      "): cells outlined in magenta are kept keys, exact (the row's top " + base.long.k + " keys and key 0); every other cell " +
      "shows the block mean, not that key's own weight." +
      (this.data.top_keys_csv ? " Kept keys: " + this.data.top_keys_csv + "." : "");
  };

  /* The current view as PNG (data URL) or SVG (text), at its layout size. */
  Explorer.prototype.exportImage = function (format) {
    if (format === "svg") return global.AttnauditExplorer.svg(this.scene);
    const canvas = document.createElement("canvas");
    canvas.width = this.scene.width;
    canvas.height = this.scene.height;
    global.AttnauditExplorer.paint(canvas.getContext("2d"), this.scene, 1);
    return canvas.toDataURL("image/png");
  };

  Explorer.prototype.download = function (format) {
    const image = this.exportImage(format);
    const href = format === "svg" ? URL.createObjectURL(new Blob([image], {type: "image/svg+xml"})) : image;
    const s = this.state;
    const link = el("a", {href: href, download: "attention-" + this.view().name.replace(/\W+/g, "_") + "-" +
      s.measure + "-example" + this.data.examples[s.example].index + "." + format});
    document.body.appendChild(link);
    link.click();
    link.remove();
    if (format === "svg") global.setTimeout(() => URL.revokeObjectURL(href), 0);
  };

  function start() {
    global.attnauditExplorers = global.attnauditExplorers || [];
    for (const root of document.querySelectorAll(".ax-explorer:not([data-ready])")) {
      root.dataset.ready = "true";
      const data = JSON.parse(root.querySelector("script.ax-data").textContent);
      global.attnauditExplorers.push(new Explorer(root, data));
    }
  }

  X.Explorer = Explorer;
  X.WINDOW = WINDOW;
  X.MEAN = MEAN;
  if (document.readyState === "loading") document.addEventListener("DOMContentLoaded", start);
  else start();
})(window);
