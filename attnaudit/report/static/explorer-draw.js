/* attnaudit attention explorer: the views as scenes (maps, rectangles, text, lines) and
 * their two renderings, a canvas (on screen and PNG export) and SVG text (export; maps are
 * embedded as pixel images, everything else is vector). Every scene opens with a title and
 * a line naming what the rows and columns are, fitted to the scene's width. */
(function (global) {
  "use strict";
  const X = global.AttnauditExplorer;
  const FONT = "11px system-ui, -apple-system, 'Segoe UI', sans-serif";
  const INELIGIBLE = [222, 225, 229];
  const ALERT = "#c62828";
  const INK = "#1d2329";
  const KEPT = "#d81b60";  // the outline of a kept key's exact weight in a zoomed block
  const HEADER = 36;  // the title and the axes line above every scene
  let measurer = null;

  function textWidth(text, weight) {
    measurer = measurer || document.createElement("canvas").getContext("2d");
    measurer.font = (weight || "400") + " " + FONT;
    return measurer.measureText(text).width;
  }

  function clamp(v, lo, hi) { return Math.max(lo, Math.min(hi, v)); }

  /* One (layer, head) map's window as a bitmap of keys x queries pixels. */
  function bitmap(ex, layer, head, q0, nq, k0, nk) {
    const canvas = document.createElement("canvas");
    canvas.width = nk;
    canvas.height = nq;
    const ctx = canvas.getContext("2d");
    const image = ctx.createImageData(nk, nq);
    const scale = ex.scale(layer, head);
    for (let q = 0; q < nq; q += 1) {
      for (let k = 0; k < nk; k += 1) {
        const v = ex.value(layer, head, q0 + q, k0 + k);
        const grey = ex.ineligible(layer, head, q0 + q, k0 + k) && !(v > 0);
        const rgb = grey ? INELIGIBLE : X.colour(scale, v);
        image.data.set([rgb[0], rgb[1], rgb[2], 255], 4 * (q * nk + k));
      }
    }
    ctx.putImageData(image, 0, 0);
    return canvas;
  }

  /* Labels of a window, thinned to one every `every` when cells are small. */
  function every(cell) { return Math.max(1, Math.ceil(11 / cell)); }

  function shorten(text, width, weight) {
    if (textWidth(text, weight) <= width) return text;
    let t = text;
    while (t.length > 1 && textWidth(t + "\u2026", weight) > width) t = t.slice(0, -1);
    return t + "\u2026";
  }

  function windowOf(ex) {
    const [, , queries, keys] = ex.view().shape;
    const s = ex.state;
    return {q0: s.qStart, nq: Math.min(queries, X.WINDOW), k0: s.kStart, nk: Math.min(keys, X.WINDOW)};
  }

  function findings(ex, scene, layer, head, w, x0, y0, cw, ch) {
    const view = ex.view();
    if (layer === X.MEAN || head === X.MEAN) return;
    for (const row of view.failing_rows) {
      const q = row.query - w.q0;
      if (row.layer === layer && row.head === head && q >= 0 && q < w.nq) {
        scene.items.push({t: "rect", x: x0 - 4, y: y0 + q * ch, w: 3, h: Math.max(ch, 1), fill: ALERT});
      }
    }
    for (const [l, h, q, k] of view.masked_cells) {
      if (l === layer && h === head && q >= w.q0 && q < w.q0 + w.nq && k >= w.k0 && k < w.k0 + w.nk) {
        scene.items.push({t: "rect", x: x0 + (k - w.k0) * cw, y: y0 + (q - w.q0) * ch, w: cw, h: ch,
          stroke: ALERT, lw: 1.5});
      }
    }
  }

  /* Outlines on a zoomed block's kept keys (exact weights; the other cells are the block
   * mean). */
  function kept(ex, scene, layer, head, w, x0, y0, cw, ch) {
    if (!ex.view().zoom) return;
    for (let q = 0; q < w.nq; q += 1) {
      for (let k = 0; k < w.nk; k += 1) {
        if (ex.kept(layer, head, w.q0 + q, w.k0 + k)) {
          scene.items.push({t: "rect", x: x0 + k * cw + 1, y: y0 + q * ch + 1, w: cw - 2, h: ch - 2,
            stroke: KEPT, lw: 2});
        }
      }
    }
  }

  /* The colour bar of the selected map; `each`: every map has its own scale (the model
   * view), so its ends read as each map's. */
  function colourBar(ex, scene, x, y, width, each) {
    const scale = ex.scale(ex.state.layer, ex.state.head);
    const n = 24;
    for (let i = 0; i < n; i += 1) {
      const rgb = X.colour(scale, scale.lo + (i + 0.5) / n * (scale.hi - scale.lo));
      scene.items.push({t: "rect", x: x + i * width / n, y: y, w: width / n + 0.5, h: 8,
        fill: "rgb(" + rgb.join(",") + ")"});
    }
    const lo = each ? (scale.diverging ? "\u2212max" : "0") : X.formatValue(scale.lo);
    scene.items.push({t: "text", x: x, y: y + 20, text: lo, anchor: "start"});
    scene.items.push({t: "text", x: x + width, y: y + 20, text: each ? "each map's max" : X.formatValue(scale.hi), anchor: "end"});
    return y + 26;
  }

  /* BertViz-style lines at (lx, ly): the window's query tokens on the left, its keys on
   * the right, a line from the current step to every key as dark as its value; returns
   * the bottom of the panel. */
  function lines(ex, scene, w, lx, ly, labelW, height) {
    const s = ex.state, view = ex.view();
    const qLabels = view.queries.slice(w.q0, w.q0 + w.nq), kLabels = view.keys.slice(w.k0, w.k0 + w.nk);
    const rows = Math.max(w.nq, w.nk);
    const rh = clamp(Math.floor(height / rows), 3, 16);
    const scale = ex.scale(s.layer, s.head);
    const top = Math.max(Math.abs(scale.lo), Math.abs(scale.hi));
    const rEvery = every(rh);
    qLabels.forEach((t, i) => {
      if (i % rEvery === 0 || w.q0 + i === s.step) {
        scene.items.push({t: "text", x: lx + labelW, y: ly + (i + 0.5) * rh + 4, text: shorten(t, labelW - 4), anchor: "end",
          weight: w.q0 + i === s.step ? "700" : "400"});
      }
    });
    kLabels.forEach((t, i) => {
      if (i % rEvery === 0) {
        scene.items.push({t: "text", x: lx + labelW + 110, y: ly + (i + 0.5) * rh + 4, text: shorten(t, labelW - 4), anchor: "start"});
      }
    });
    if (s.step >= w.q0 && s.step < w.q0 + w.nq) {
      const yq = ly + (s.step - w.q0 + 0.5) * rh;
      kLabels.forEach((_, i) => {
        const v = ex.value(s.layer, s.head, s.step, w.k0 + i);
        if (Number.isFinite(v) && v !== 0) {
          scene.items.push({t: "line", x1: lx + labelW + 4, y1: yq, x2: lx + labelW + 106, y2: ly + (i + 0.5) * rh,
            stroke: v < 0 ? "#b2182b" : "#24527a", alpha: clamp(Math.abs(v) / top, 0.04, 1), lw: 2});
        }
      });
    }
    return ly + rows * rh;
  }

  function headLayout(ex, width) {
    const s = ex.state, view = ex.view(), w = windowOf(ex);
    const scene = {width: width, items: [], hits: []};
    const layerText = s.layer === X.MEAN ? "mean over layers" : "layer " + s.layer + " (" + view.sites[s.layer] + ")";
    const heads = ex.measure(s.measure).heads;
    const headText = heads === 1 ? "" : s.head === X.MEAN ? ", mean over heads" : ", head " + s.head;
    scene.title = view.title + ": " + s.measure + ", " + layerText + headText;
    const qLabels = view.queries.slice(w.q0, w.q0 + w.nq), kLabels = view.keys.slice(w.k0, w.k0 + w.nk);
    const labelW = clamp(Math.max(...qLabels.map(textWidth), ...kLabels.map(textWidth)) + 8, 24, 110);
    const linesW = 2 * labelW + 110;
    let cell = Math.floor((width - linesW - 24 - labelW - 8) / w.nk);
    const beside = cell >= 8;
    if (!beside) cell = Math.floor((width - labelW - 8) / w.nk);
    cell = clamp(cell, 2, 26);
    const cw = cell, ch = cell;
    const x0 = labelW + 6, y0 = HEADER + 10 + labelW;
    scene.items.push({t: "map", x: x0, y: y0, w: w.nk * cw, h: w.nq * ch,
      bitmap: bitmap(ex, s.layer, s.head, w.q0, w.nq, w.k0, w.nk)});
    scene.hits.push({x: x0, y: y0, w: w.nk * cw, h: w.nq * ch, cw: cw, ch: ch, q0: w.q0, k0: w.k0, layer: s.layer, head: s.head});
    const qEvery = every(ch), kEvery = every(cw);
    qLabels.forEach((t, i) => {
      if (i % qEvery === 0 || w.q0 + i === s.step) {
        scene.items.push({t: "text", x: x0 - 6, y: y0 + (i + 0.5) * ch + 4, text: shorten(t, labelW - 8), anchor: "end",
          weight: w.q0 + i === s.step ? "700" : "400"});
      }
    });
    kLabels.forEach((t, i) => {
      if (i % kEvery === 0 || w.k0 + i === s.key) {
        scene.items.push({t: "text", x: x0 + (i + 0.5) * cw + 4, y: y0 - 6, text: shorten(t, labelW - 8), anchor: "start",
          rotate: -90, weight: w.k0 + i === s.key ? "700" : "400"});
      }
    });
    findings(ex, scene, s.layer, s.head, w, x0, y0, cw, ch);
    kept(ex, scene, s.layer, s.head, w, x0, y0, cw, ch);
    if (s.step >= w.q0 && s.step < w.q0 + w.nq) {
      scene.items.push({t: "rect", x: x0, y: y0 + (s.step - w.q0) * ch, w: w.nk * cw, h: ch, stroke: "#ffffff", lw: 1});
      if (s.key >= w.k0 && s.key < w.k0 + w.nk) {
        scene.items.push({t: "rect", x: x0 + (s.key - w.k0) * cw, y: y0 + (s.step - w.q0) * ch, w: cw, h: ch, stroke: INK, lw: 2});
      }
    }
    let bottom = colourBar(ex, scene, x0, y0 + w.nq * ch + 10, Math.min(200, Math.max(80, w.nk * cw)), false);
    const lx = beside ? x0 + w.nk * cw + 24 : 0;
    const ly = beside ? y0 : bottom + 10;
    bottom = Math.max(bottom, lines(ex, scene, w, lx, ly, labelW, Math.max(w.nq * ch, 200)));
    scene.width = Math.max(beside ? lx + linesW : x0 + w.nk * cw, 200);
    scene.height = bottom + 8;
    return scene;
  }

  function modelLayout(ex, width) {
    const s = ex.state, view = ex.view(), w = windowOf(ex);
    const [layers] = view.shape;
    const heads = ex.measure(s.measure).heads;
    const scene = {width: width, items: [], hits: []};
    scene.title = view.title + ": " + s.measure + ", every layer and head";
    const left = 56, top = HEADER + 26, gap = 8;
    const size = clamp(Math.floor((width - left) / heads) - gap, 36, 150);
    const cw = size / w.nk, ch = size / w.nq;
    for (let h = 0; h < heads; h += 1) {
      scene.items.push({t: "text", x: left + h * (size + gap) + size / 2, y: top - 8, text: heads === 1 ? "one map" : "head " + h, anchor: "middle"});
    }
    for (let l = 0; l < layers; l += 1) {
      const y = top + l * (size + gap);
      scene.items.push({t: "text", x: left - 8, y: y + size / 2 + 4, text: "layer " + l, anchor: "end"});
      for (let h = 0; h < heads; h += 1) {
        const x = left + h * (size + gap);
        scene.items.push({t: "map", x: x, y: y, w: size, h: size, bitmap: bitmap(ex, l, h, w.q0, w.nq, w.k0, w.nk)});
        scene.hits.push({x: x, y: y, w: size, h: size, cw: cw, ch: ch, q0: w.q0, k0: w.k0, layer: l, head: h});
        findings(ex, scene, l, h, w, x, y, cw, ch);
        if (s.step >= w.q0 && s.step < w.q0 + w.nq) {
          scene.items.push({t: "rect", x: x, y: y + (s.step - w.q0) * ch, w: size, h: Math.max(ch, 1), stroke: "#ffffff", lw: 1});
        }
        if ((s.layer === l || s.layer === X.MEAN) && (s.head === h || s.head === X.MEAN || heads === 1)) {
          scene.items.push({t: "rect", x: x - 2, y: y - 2, w: size + 4, h: size + 4, stroke: INK, lw: 2});
        }
      }
    }
    const bottom = colourBar(ex, scene, left, top + layers * (size + gap) + 4, 200, ex.state.scale !== "fixed");
    scene.width = Math.max(left + heads * (size + gap), 260);
    scene.height = bottom + 8;
    return scene;
  }

  /* The scene of the current view, in whole CSS pixels (its PNG is that size), widened to
   * hold its title and axes line where `width` allows, and they shortened to fit it. */
  function layout(ex, width) {
    const scene = ex.state.mode === "model" ? modelLayout(ex, width) : headLayout(ex, width);
    const axes = ex.view().axes;
    const lines = [[scene.title, "600", 14], ["rows: " + axes[0] + "; columns: " + axes[1], "400", 30]];
    scene.width = Math.max(scene.width, ...lines.map(([text, weight]) => Math.min(width, Math.ceil(textWidth(text, weight)) + 2)));
    scene.items.unshift(...lines.map(([text, weight, y]) => ({t: "text", x: 0, y: y, text: shorten(text, scene.width, weight), weight: weight})));
    scene.width = Math.ceil(scene.width);
    scene.height = Math.ceil(scene.height);
    return scene;
  }

  function paint(ctx, scene, ratio) {
    ctx.setTransform(ratio, 0, 0, ratio, 0, 0);
    ctx.fillStyle = "#ffffff";
    ctx.fillRect(0, 0, scene.width, scene.height);
    ctx.imageSmoothingEnabled = false;
    ctx.font = FONT;
    for (const it of scene.items) {
      ctx.globalAlpha = it.alpha === undefined ? 1 : it.alpha;
      if (it.t === "map") ctx.drawImage(it.bitmap, it.x, it.y, it.w, it.h);
      else if (it.t === "rect") {
        if (it.fill) { ctx.fillStyle = it.fill; ctx.fillRect(it.x, it.y, it.w, it.h); }
        if (it.stroke) { ctx.strokeStyle = it.stroke; ctx.lineWidth = it.lw || 1; ctx.strokeRect(it.x, it.y, it.w, it.h); }
      } else if (it.t === "line") {
        ctx.strokeStyle = it.stroke; ctx.lineWidth = it.lw || 1;
        ctx.beginPath(); ctx.moveTo(it.x1, it.y1); ctx.lineTo(it.x2, it.y2); ctx.stroke();
      } else if (it.t === "text") {
        ctx.save();
        ctx.fillStyle = it.fill || INK;
        ctx.font = (it.weight || "400") + " " + FONT;
        ctx.textAlign = it.anchor === "end" ? "right" : it.anchor === "middle" ? "center" : "left";
        ctx.translate(it.x, it.y);
        if (it.rotate) ctx.rotate(it.rotate * Math.PI / 180);
        ctx.fillText(it.text, 0, 0);
        ctx.restore();
      }
    }
    ctx.globalAlpha = 1;
  }

  function esc(text) {
    return String(text).replace(/&/g, "&amp;").replace(/</g, "&lt;").replace(/>/g, "&gt;").replace(/"/g, "&quot;");
  }

  function n(v) { return Math.round(v * 100) / 100; }

  function svg(scene) {
    const out = ['<svg xmlns="http://www.w3.org/2000/svg" width="' + scene.width + '" height="' + scene.height +
      '" viewBox="0 0 ' + scene.width + " " + scene.height + '" font-family="system-ui, sans-serif" font-size="11">',
      '<rect width="100%" height="100%" fill="#ffffff"/>'];
    for (const it of scene.items) {
      const alpha = it.alpha === undefined ? "" : ' opacity="' + n(it.alpha) + '"';
      if (it.t === "map") {
        out.push('<image x="' + n(it.x) + '" y="' + n(it.y) + '" width="' + n(it.w) + '" height="' + n(it.h) +
          '" preserveAspectRatio="none" style="image-rendering:pixelated" href="' + it.bitmap.toDataURL("image/png") + '"/>');
      } else if (it.t === "rect") {
        out.push('<rect x="' + n(it.x) + '" y="' + n(it.y) + '" width="' + n(it.w) + '" height="' + n(it.h) + '" fill="' +
          (it.fill || "none") + '"' + (it.stroke ? ' stroke="' + it.stroke + '" stroke-width="' + (it.lw || 1) + '"' : "") + "/>");
      } else if (it.t === "line") {
        out.push('<line x1="' + n(it.x1) + '" y1="' + n(it.y1) + '" x2="' + n(it.x2) + '" y2="' + n(it.y2) + '" stroke="' +
          it.stroke + '" stroke-width="' + (it.lw || 1) + '"' + alpha + "/>");
      } else if (it.t === "text") {
        const anchor = it.anchor === "end" ? "end" : it.anchor === "middle" ? "middle" : "start";
        const turn = it.rotate ? ' transform="rotate(' + it.rotate + " " + n(it.x) + " " + n(it.y) + ')"' : "";
        out.push('<text x="' + n(it.x) + '" y="' + n(it.y) + '" text-anchor="' + anchor + '" font-weight="' +
          (it.weight || "400") + '" fill="' + (it.fill || INK) + '"' + turn + ">" + esc(it.text) + "</text>");
      }
    }
    out.push("</svg>");
    return out.join("\n");
  }

  Object.assign(X, {layout: layout, paint: paint, svg: svg});
})(window);
