// ggml-viz report page. Every string from the trace is put into the DOM with textContent or
// drawn on a canvas: never parsed as markup.
(function () {
  'use strict';
  const D = JSON.parse(document.getElementById('ggml-viz-data').textContent);
  const S = D.strings;

  function el(tag, cls, text) {
    const e = document.createElement(tag);
    if (cls) e.className = cls;
    if (text !== undefined) e.textContent = String(text);
    return e;
  }
  function fmtNs(ns) {
    if (ns < 1e3) return ns.toFixed(0) + ' ns';
    if (ns < 1e6) return (ns / 1e3).toFixed(2) + ' µs';
    if (ns < 1e9) return (ns / 1e6).toFixed(2) + ' ms';
    return (ns / 1e9).toFixed(3) + ' s';
  }
  // An axis tick at `ns`, ticks `step` ns apart: in the unit of the step, with the decimals
  // the step needs (2 ms, 2.5 ms, 2.25 ms).
  function fmtTick(ns, step) {
    const units = [[1e9, ' s'], [1e6, ' ms'], [1e3, ' µs'], [1, ' ns']];
    const [div, unit] = units.find(function (u) { return step >= u[0]; }) || units[3];
    const decimals = Math.max(0, Math.min(3, Math.ceil(-Math.log10(step / div) - 1e-9)));
    return (ns / div).toFixed(decimals) + unit;
  }
  function fmtBytes(b) {
    const u = ['B', 'KiB', 'MiB', 'GiB', 'TiB'];
    let i = 0;
    while (b >= 1024 && i < u.length - 1) { b /= 1024; i++; }
    return (i === 0 ? b.toFixed(0) : b.toFixed(1)) + ' ' + u[i];
  }
  function fmtCount(n) { return Number(n).toLocaleString('en-US'); }

  // ---- header, summary numbers, notes ----
  document.getElementById('inputs').textContent = D.inputs.join(', ');
  document.getElementById('footer').textContent = 'Made by ' + D.generator + '.';
  const sum = D.summary;
  const cards = document.getElementById('summary');
  function card(k, v, bad) {
    const c = el('div', bad ? 'card bad' : 'card');
    c.appendChild(el('div', 'v', v));
    c.appendChild(el('div', 'k', k));
    c.dataset.key = k;
    cards.appendChild(c);
  }
  card('wall time', fmtNs(sum.wall_ns));
  card('graph computes', fmtCount(sum.graphs));
  card('ops', fmtCount(sum.ops));
  card('events', fmtCount(sum.events));
  card('events dropped', fmtCount(sum.dropped), sum.dropped > 0);
  card('damage', sum.damage.length ? sum.damage.length + ' found' : 'none', sum.damage.length > 0);

  const notes = document.getElementById('notes');
  function note(text, items, bad) {
    const n = el('div', bad ? 'note bad' : 'note', text);
    if (items && items.length) {
      const ul = el('ul');
      for (const i of items) ul.appendChild(el('li', '', i));
      n.appendChild(ul);
    }
    notes.appendChild(n);
  }
  if (sum.damage.length) note('Damage in the input: everything before it is shown.', sum.damage, true);
  if (sum.dropped > 0) note(fmtCount(sum.dropped) + ' events could not be recorded (rings full or event cap reached): the timeline has gaps.');
  if (sum.warnings.length) {
    const more = sum.warnings_not_shown ? ' (' + fmtCount(sum.warnings_not_shown) + ' more not shown)' : '';
    note('Warnings' + more + ':', sum.warnings);
  }
  if (D.sampling.op_stride > 1) {
    note('The timeline draws ' + fmtCount(D.sampling.drawn_spans) + ' of ' + fmtCount(D.sampling.total_spans) +
      ' spans: every graph, and the op spans of about 1 graph in ' + D.sampling.op_stride +
      ', worker threads\' shares of about 1 millisecond in ' + D.sampling.op_stride +
      ' (both chosen uniformly over the run). The tables and charts count every span.');
  }
  if (sum.clock_relative) note('Timestamps are not wall-clock time: times are relative to the start of the trace.');

  // ---- timeline ----
  const sp = D.spans;
  const N = sp.start.length;
  const canvas = document.getElementById('timeline-canvas');
  const rangeLabel = document.getElementById('timeline-range');
  const tooltip = document.getElementById('tooltip');
  const ROW = 18, LANE_GAP = 8, LABEL_W = 190, AXIS = 22;
  let tEnd = 0;
  for (let i = 0; i < N; i++) tEnd = Math.max(tEnd, sp.start[i] + sp.dur[i]);
  if (tEnd === 0) tEnd = 1;
  // Rows: one per (lane, depth), each with its spans sorted by start.
  const rows = [];
  const laneTop = [];
  let y = AXIS;
  const rowOf = new Map();
  D.lanes.forEach(function (lane, li) {
    laneTop.push(y);
    for (let d = 0; d < lane.rows; d++) {
      const r = { lane: li, depth: d, y: y + d * ROW, idx: [], maxDur: 0 };
      rowOf.set(li * 4096 + d, r);
      rows.push(r);
    }
    y += lane.rows * ROW + LANE_GAP;
  });
  const height = Math.max(y, AXIS + ROW);
  for (let i = 0; i < N; i++) {
    const r = rowOf.get(sp.lane[i] * 4096 + sp.depth[i]);
    if (r) { r.idx.push(i); if (sp.dur[i] > r.maxDur) r.maxDur = sp.dur[i]; }
  }
  for (const r of rows) r.idx.sort(function (a, b) { return sp.start[a] - sp.start[b]; });

  const view = { t0: 0, t1: tEnd };
  // Op types, by their drawn time: the first ones take colours apart from one another, the
  // rest (and other spans: graph computes, calls) a colour from their name.
  const opTime = new Map();
  for (let i = 0; i < N; i++) {
    if (S[sp.cat[i]] === 'op') opTime.set(sp.name[i], (opTime.get(sp.name[i]) || 0) + sp.dur[i]);
  }
  const opsByTime = Array.from(opTime.keys()).sort(function (a, b) { return opTime.get(b) - opTime.get(a); });
  const OP_PALETTE = ['#8fb3ef', '#f4a261', '#7fc97f', '#e78ac3', '#ffd92f', '#a6cee3', '#fb9a99',
    '#b3a2dc', '#66c2a5', '#e5c494', '#bcbd22', '#9edae5'];
  const colors = new Map();
  opsByTime.slice(0, OP_PALETTE.length).forEach(function (idx, k) { colors.set(idx, OP_PALETTE[k]); });
  function color(nameIdx) {
    let c = colors.get(nameIdx);
    if (!c) {
      let h = 2166136261;
      const s = S[nameIdx];
      for (let i = 0; i < s.length; i++) { h ^= s.charCodeAt(i); h = Math.imul(h, 16777619); }
      c = 'hsl(' + ((h >>> 0) % 360) + ',55%,' + (62 + ((h >>> 9) % 12)) + '%)';
      colors.set(nameIdx, c);
    }
    return c;
  }
  function plotWidth() { return Math.max(1, canvas.clientWidth - LABEL_W); }
  function xOf(t) { return LABEL_W + (t - view.t0) / (view.t1 - view.t0) * plotWidth(); }
  function tOf(x) { return view.t0 + (x - LABEL_W) / plotWidth() * (view.t1 - view.t0); }
  function firstAtOrAfter(r, t) {
    let lo = 0, hi = r.idx.length;
    while (lo < hi) { const m = (lo + hi) >> 1; if (sp.start[r.idx[m]] < t) lo = m + 1; else hi = m; }
    return lo;
  }
  function niceStep(span, target) {
    const raw = span / target;
    const p = Math.pow(10, Math.floor(Math.log10(raw)));
    for (const m of [1, 2, 5, 10]) if (m * p >= raw) return m * p;
    return 10 * p;
  }

  function draw() {
    const dpr = window.devicePixelRatio || 1;
    const w = canvas.clientWidth;
    canvas.style.height = height + 'px';
    canvas.width = Math.round(w * dpr);
    canvas.height = Math.round(height * dpr);
    const g = canvas.getContext('2d');
    g.setTransform(dpr, 0, 0, dpr, 0, 0);
    g.fillStyle = '#fff';
    g.fillRect(0, 0, w, height);
    g.font = '11px system-ui, sans-serif';
    g.textBaseline = 'middle';
    // Axis.
    const step = niceStep(view.t1 - view.t0, Math.max(2, plotWidth() / 110));
    g.strokeStyle = '#eef0f4';
    g.fillStyle = '#667085';
    for (let t = Math.ceil(view.t0 / step) * step; t <= view.t1; t += step) {
      const x = xOf(t);
      g.beginPath(); g.moveTo(x + 0.5, AXIS - 4); g.lineTo(x + 0.5, height); g.stroke();
      g.fillText(fmtNs(t), x + 3, AXIS / 2);
    }
    // Spans; those narrower than a pixel share it.
    for (const r of rows) {
      const from = firstAtOrAfter(r, view.t0 - r.maxDur);
      let lastPx = -1;
      g.save();
      g.beginPath(); g.rect(LABEL_W, r.y, w - LABEL_W, ROW); g.clip();
      for (let k = from; k < r.idx.length; k++) {
        const i = r.idx[k];
        const s = sp.start[i];
        if (s > view.t1) break;
        if (s + sp.dur[i] < view.t0) continue;
        const x0 = xOf(s), x1 = xOf(s + sp.dur[i]);
        const wpx = x1 - x0;
        if (wpx < 1) {
          const px = Math.floor(x0);
          if (px <= lastPx) continue;
          lastPx = px;
          g.fillStyle = color(sp.name[i]);
          g.fillRect(px, r.y + 1, 1, ROW - 2);
          continue;
        }
        g.fillStyle = color(sp.name[i]);
        g.fillRect(x0, r.y + 1, wpx, ROW - 2);
        lastPx = Math.floor(x1);
        if (wpx > 40) {
          const cx = Math.max(x0, LABEL_W) + 3;
          g.fillStyle = '#1d2330';
          g.save(); g.beginPath(); g.rect(cx, r.y, Math.min(x1, w) - cx - 2, ROW); g.clip();
          g.fillText(S[sp.name[i]] + (sp.tensor[i] ? ' ' + S[sp.tensor[i]] : ''), cx, r.y + ROW / 2);
          g.restore();
        }
      }
      g.restore();
    }
    // Lane labels.
    g.fillStyle = '#f6f8fb';
    g.fillRect(0, 0, LABEL_W, height);
    g.fillStyle = '#1d2330';
    D.lanes.forEach(function (lane, li) {
      // The process on the first line, the lane under it (or after it when the lane has one row).
      const lines = lane.rows > 1 && lane.process ? [lane.process, lane.name]
        : [lane.process ? lane.process + ' · ' + lane.name : lane.name];
      g.save(); g.beginPath(); g.rect(0, laneTop[li], LABEL_W - 6, ROW * lane.rows); g.clip();
      lines.forEach(function (text, k) { g.fillText(text, 6, laneTop[li] + k * ROW + ROW / 2); });
      g.restore();
      g.strokeStyle = '#e3e7ee';
      g.beginPath(); g.moveTo(0, laneTop[li] - LANE_GAP / 2 + 0.5); g.lineTo(w, laneTop[li] - LANE_GAP / 2 + 0.5); g.stroke();
    });
    rangeLabel.textContent = 'Showing ' + fmtNs(view.t0) + ' to ' + fmtNs(view.t1) +
      ' (' + fmtNs(view.t1 - view.t0) + ') of ' + fmtNs(tEnd) + ', ' + fmtCount(N) + ' spans';
    rangeLabel.dataset.t0 = String(view.t0);
    rangeLabel.dataset.t1 = String(view.t1);
  }

  let pending = false;
  function redraw() {
    if (pending) return;
    pending = true;
    requestAnimationFrame(function () { pending = false; draw(); });
  }
  function clampView() {
    const minSpan = 100; // ns
    let span = Math.max(minSpan, Math.min(tEnd, view.t1 - view.t0));
    let t0 = Math.max(0, Math.min(view.t0, tEnd - span));
    view.t0 = t0; view.t1 = t0 + span;
  }
  function zoom(factor, atX) {
    const t = tOf(atX === undefined ? LABEL_W + plotWidth() / 2 : atX);
    view.t0 = t - (t - view.t0) * factor;
    view.t1 = t + (view.t1 - t) * factor;
    clampView(); redraw();
  }
  function pan(fraction) {
    const d = (view.t1 - view.t0) * fraction;
    view.t0 += d; view.t1 += d;
    clampView(); redraw();
  }
  canvas.addEventListener('wheel', function (e) {
    e.preventDefault();
    const x = e.clientX - canvas.getBoundingClientRect().left;
    if (e.shiftKey || Math.abs(e.deltaX) > Math.abs(e.deltaY)) pan((e.deltaX || e.deltaY) / 1000);
    else zoom(Math.pow(1.0015, e.deltaY), Math.max(LABEL_W, x));
  }, { passive: false });
  let drag = null;
  canvas.addEventListener('mousedown', function (e) { drag = { x: e.clientX, t0: view.t0, t1: view.t1 }; canvas.style.cursor = 'grabbing'; });
  window.addEventListener('mouseup', function () { drag = null; canvas.style.cursor = ''; });
  window.addEventListener('mousemove', function (e) {
    if (!drag) return;
    const dt = (e.clientX - drag.x) / plotWidth() * (drag.t1 - drag.t0);
    view.t0 = drag.t0 - dt; view.t1 = drag.t1 - dt;
    clampView(); redraw();
  });
  document.addEventListener('keydown', function (e) {
    if (e.ctrlKey || e.metaKey || e.altKey) return;
    const k = e.key;
    if (k === 'w' || k === 'W' || k === '+' || k === '=') zoom(0.7);
    else if (k === 's' || k === 'S' || k === '-') zoom(1 / 0.7);
    else if (k === 'a' || k === 'A' || k === 'ArrowLeft') pan(-0.2);
    else if (k === 'd' || k === 'D' || k === 'ArrowRight') pan(0.2);
    else if (k === '0' || k === 'Escape') { view.t0 = 0; view.t1 = tEnd; redraw(); }
    else return;
    e.preventDefault();
  });

  function spanAt(x, yy) {
    for (const r of rows) {
      if (yy < r.y || yy >= r.y + ROW) continue;
      const slack = (view.t1 - view.t0) / plotWidth() * 2; // 2 px, for spans drawn 1 px wide
      const t = tOf(x);
      let k = firstAtOrAfter(r, t + slack) - 1;
      for (let n = 0; k >= 0 && n < 256; k--, n++) {
        const i = r.idx[k];
        if (sp.start[i] <= t + slack && sp.start[i] + sp.dur[i] >= t - slack) return i;
        if (sp.start[i] + r.maxDur < t - slack) break;
      }
      return -1;
    }
    return -1;
  }
  canvas.addEventListener('mousemove', function (e) {
    const b = canvas.getBoundingClientRect();
    const x = e.clientX - b.left, yy = e.clientY - b.top;
    const i = x >= LABEL_W ? spanAt(x, yy) : -1;
    if (i < 0) { tooltip.hidden = true; return; }
    const lines = [S[sp.name[i]] + '  (' + S[sp.cat[i]] + ')'];
    if (S[sp.cat[i]] === 'op') lines.push('op: ' + S[sp.name[i]]);
    if (sp.tensor[i]) lines.push('tensor: ' + S[sp.tensor[i]]);
    if (sp.detail[i]) lines.push(S[sp.detail[i]]);
    if (sp.bytes[i]) lines.push('bytes: ' + fmtBytes(sp.bytes[i]));
    lines.push('duration: ' + fmtNs(sp.dur[i]) + '   self: ' + fmtNs(sp.self_ns[i]));
    const lane = D.lanes[sp.lane[i]];
    lines.push('start: ' + fmtNs(sp.start[i]) + '   ' + (lane.process ? lane.process + ' · ' : '') + lane.name);
    tooltip.textContent = lines.join('\n');
    tooltip.hidden = false;
    const tx = Math.min(e.clientX + 14, window.innerWidth - tooltip.offsetWidth - 8);
    tooltip.style.left = tx + 'px';
    tooltip.style.top = (e.clientY + 16) + 'px';
  });
  canvas.addEventListener('mouseleave', function () { tooltip.hidden = true; });
  window.addEventListener('resize', redraw);
  draw();

  // The timeline's colours of op types, the most drawn time first.
  (function legend() {
    const host = document.getElementById('timeline-legend');
    if (!opsByTime.length) return;
    const SHOWN = 16;
    host.appendChild(document.createTextNode('Op types:'));
    for (const idx of opsByTime.slice(0, SHOWN)) {
      const key = el('span', 'key');
      const sw = el('i');
      sw.style.background = color(idx);
      key.appendChild(sw);
      key.appendChild(document.createTextNode(S[idx]));
      host.appendChild(key);
    }
    if (opsByTime.length > SHOWN) host.appendChild(document.createTextNode(' … ' + (opsByTime.length - SHOWN) + ' more'));
  })();

  // ---- bars: time per op type, backend, tensor ----
  // Rows of spans have a self time (less their children's), rows of nodes (op timings, each
  // node once however many threads computed it) their threads' time, imbalance (of the
  // working threads' time, the share spent done and waiting for the slowest) and wait (of the
  // threads' time in and after the nodes, the share spent at barriers): a column each,
  // where any row has it ('-' in a row without).
  function bars(id, rows, note) {
    const host = document.getElementById(id);
    if (!rows.length) { host.appendChild(el('div', 'muted', note || 'Nothing recorded.')); return; }
    const hasSelf = rows.some(function (r) { return r.self_ns !== null; });
    const hasThreads = rows.some(function (r) { return r.thread_ns !== null; });
    const legend = el('div', 'legend');
    const l1 = el('i'); l1.style.background = '#c9d7f5';
    legend.appendChild(l1); legend.appendChild(document.createTextNode(hasSelf ? 'total' : 'wall time'));
    if (hasSelf) {
      const l2 = el('i'); l2.style.background = 'var(--accent)';
      legend.appendChild(l2); legend.appendChild(document.createTextNode('self'));
    }
    host.appendChild(legend);
    const t = el('table', 'bars');
    const head = el('tr');
    const heads = ['name', 'count', 'total'].concat(hasSelf ? ['self'] : [],
      hasThreads ? ['thread time', 'imbal.', 'wait'] : [], ['mean', 'share', '']);
    for (const h of heads) head.appendChild(el('th', '', h));
    t.appendChild(head);
    const max = rows[0].total_ns || 1;
    const all = rows.reduce(function (a, r) { return a + r.total_ns; }, 0) || 1;
    const ns = function (v) { return v === null ? '-' : fmtNs(v); };
    for (const r of rows) {
      const tr = el('tr');
      const name = el('td', '', r.name);
      name.title = r.name;
      tr.appendChild(name);
      tr.appendChild(el('td', '', fmtCount(r.count)));
      tr.appendChild(el('td', '', fmtNs(r.total_ns)));
      if (hasSelf) tr.appendChild(el('td', '', ns(r.self_ns)));
      if (hasThreads) {
        tr.appendChild(el('td', '', ns(r.thread_ns)));
        tr.appendChild(el('td', '', r.imbalance === null ? '-' : (100 * r.imbalance).toFixed(1) + '%'));
        tr.appendChild(el('td', '', r.wait_share === null ? '-' : (100 * r.wait_share).toFixed(1) + '%'));
      }
      tr.appendChild(el('td', '', fmtNs(r.total_ns / Math.max(1, r.count))));
      tr.appendChild(el('td', '', (100 * r.total_ns / all).toFixed(1) + '%'));
      const cell = el('td', 'bar');
      const total = el('div', 'total');
      total.style.width = (100 * r.total_ns / max).toFixed(2) + '%';
      if (r.self_ns !== null) {
        const self = el('div', 'self');
        self.style.width = (r.total_ns ? 100 * Math.min(r.self_ns, r.total_ns) / r.total_ns : 0).toFixed(2) + '%';
        total.appendChild(self);
      }
      cell.appendChild(total);
      tr.appendChild(cell);
      t.appendChild(tr);
    }
    host.appendChild(t);
    if (note) host.appendChild(el('div', 'muted', note));
  }
  document.getElementById('by-op-source').textContent = D.by_op.length ? 'From ' + D.by_op_source + '.' : '';
  for (const line of D.timing_cost) document.getElementById('timing-cost').appendChild(el('div', '', line));
  bars('by-op', D.by_op, D.by_op.length ? '' : 'No spans. Record with GGML_VIZ_OP_TIMING=1 for per-op times.');
  bars('by-backend', D.by_backend);
  if (D.by_layer.length) {
    document.getElementById('by-layer-section').hidden = false;
    bars('by-layer', D.by_layer);
  }
  bars('by-tensor', D.by_tensor, D.tensors_not_shown ? fmtCount(D.tensors_not_shown) + ' more tensors not shown.' :
    (D.by_tensor.length ? '' : 'No op spans with tensor names (record with GGML_VIZ_OP_TIMING=1).'));

  // ---- sequences: a batching server's slots ----
  if (D.sequences.length) {
    document.getElementById('sequences-section').hidden = false;
    const t = el('table', 'bars');
    const head = el('tr');
    for (const h of ['sequence', 'requests', 'prefill tokens', 'generated tokens', 'request p50', 'request p99', 'per generated token']) head.appendChild(el('th', '', h));
    t.appendChild(head);
    for (const r of D.sequences) {
      const tr = el('tr');
      tr.appendChild(el('td', '', r.name));
      tr.appendChild(el('td', '', fmtCount(r.requests)));
      tr.appendChild(el('td', '', fmtCount(r.prefill_tokens)));
      tr.appendChild(el('td', '', fmtCount(r.generation_tokens)));
      tr.appendChild(el('td', '', fmtNs(r.request_p50_ns)));
      tr.appendChild(el('td', '', fmtNs(r.request_p99_ns)));
      tr.appendChild(el('td', '', r.per_token_ns === null ? '-' : fmtNs(r.per_token_ns)));
      t.appendChild(tr);
    }
    document.getElementById('sequences').appendChild(t);
  }

  // ---- charts ----
  const palette = ['#3b6fd8', '#e8590c', '#2f9e44', '#ae3ec9', '#1098ad', '#f59f00', '#e03131', '#495057'];
  function chartWidth(host) { return Math.max(300, host.clientWidth || 800); }
  const charts = [];
  function chart(hostId, title, yLabel, series, fmtY, stepped) {
    const host = document.getElementById(hostId);
    // uPlot takes one x array: the union of the series' times, with gaps (null) or, for
    // stepped counters, the last value carried forward.
    const xs = Array.from(new Set([].concat.apply([], series.map(function (s) { return s.t; })))).sort(function (a, b) { return a - b; });
    const pos = new Map(xs.map(function (x, i) { return [x, i]; }));
    const data = [xs];
    for (const s of series) {
      const ys = new Array(xs.length).fill(null);
      for (let i = 0; i < s.t.length; i++) ys[pos.get(s.t[i])] = s.y[i];
      if (stepped) { let last = null; for (let i = 0; i < ys.length; i++) { if (ys[i] === null) ys[i] = last; else last = ys[i]; } }
      data.push(ys);
    }
    const opts = {
      title: title,
      width: chartWidth(host),
      height: 260,
      scales: { x: { time: false } },
      axes: [
        { label: 'time from start', space: 90, values: function (u, v, i, space, step) { return v.map(function (x) { return fmtTick(x * 1e9, step * 1e9); }); } },
        { label: yLabel, size: 80, values: function (u, v) { return v.map(fmtY); } },
      ],
      series: [{ label: 'time', value: function (u, v) { return v == null ? '' : fmtNs(v * 1e9); } }].concat(series.map(function (s, i) {
        const c = palette[i % palette.length];
        return stepped
          ? { label: s.name, stroke: c, width: 1.5, paths: uPlot.paths.stepped({ align: 1 }), points: { show: false }, value: function (u, v) { return v == null ? '' : fmtY(v); } }
          : { label: s.name, stroke: c, width: 0, paths: function () { return null; }, points: { show: true, size: 5, fill: c, stroke: c }, value: function (u, v) { return v == null ? '' : fmtY(v); } };
      })),
      legend: { live: true },
      cursor: { drag: { x: true, y: false } },
    };
    const plot = new uPlot(opts, data, host);
    // Reachable from the page (the browser test reads its axes; so can a user, in devtools).
    host.uplot = plot;
    charts.push({ host: host, plot: plot });
  }
  const lat = D.latency;
  document.getElementById('latency-source').textContent = lat.source
    ? 'From ' + lat.source + ', each measured to completion: until the last wait (synchronize) that follows it on its thread ends, not to the return of an asynchronous enqueue.'
    : '';
  const latStats = document.getElementById('latency-stats');
  for (const s of lat.series) {
    const c = el('div', 'card');
    c.appendChild(el('div', 'v', 'p50 ' + fmtNs(s.p50_ns) + ' · p99 ' + fmtNs(s.p99_ns)));
    c.appendChild(el('div', 'k', s.name + ': ' + fmtCount(s.count) + ' calls' + (s.per_token_ns ? ', ' + fmtNs(s.per_token_ns) + ' per token' : '')));
    c.dataset.series = s.name;
    latStats.appendChild(c);
  }
  if (lat.series.length) {
    chart('latency', 'Latency per call', 'latency', lat.series.map(function (s) { return { name: s.name, t: s.t, y: s.ms }; }),
      function (v) { return fmtNs(v * 1e6); }, false);
  } else {
    document.getElementById('latency').appendChild(el('div', 'muted', 'No decode calls or graph computes in the input.'));
  }
  if (D.memory_by_use.length) {
    // What the buffers held, as llama.cpp prints its buffer sizes (MiB).
    const inputs = new Set(D.memory_by_use.map(function (r) { return r.input; }));
    const t = el('table', 'bars memory-by-use');
    const head = el('tr');
    const cols = (inputs.size > 1 ? ['input'] : []).concat(['held', 'buffer type', 'buffers', 'peak', 'at end']);
    for (const h of cols) head.appendChild(el('th', '', h));
    t.appendChild(head);
    for (const r of D.memory_by_use) {
      const tr = el('tr');
      if (inputs.size > 1) tr.appendChild(el('td', '', r.input));
      tr.appendChild(el('td', '', r.held));
      tr.appendChild(el('td', '', r.buffer_type));
      tr.appendChild(el('td', '', fmtCount(r.buffers)));
      tr.appendChild(el('td', '', r.peak_mib));
      tr.appendChild(el('td', '', r.end_mib));
      t.appendChild(tr);
    }
    document.getElementById('memory-by-use').appendChild(t);
  }
  if (D.memory.length) {
    chart('memory', 'Live bytes', 'bytes', D.memory.map(function (s) { return { name: s.name, t: s.t, y: s.values }; }), fmtBytes, true);
    if (D.memory_note) document.getElementById('memory').appendChild(el('div', 'muted', D.memory_note));
  } else {
    document.getElementById('memory').appendChild(el('div', 'muted', 'No buffer events (record with GGML_VIZ_MEMORY_TRACKING=1).'));
  }
  window.addEventListener('resize', function () {
    for (const c of charts) c.plot.setSize({ width: chartWidth(c.host), height: 260 });
  });
})();
