// The results viewer: every label/class score and the verdict over pts (uPlot), segments shaded,
// zoom/pan re-requesting the decimated range, a click showing that frame with its boxes, the
// output video driving the cursor, a second run overlaid. Data from /console/api/... only.
"use strict";
(function () {
  var root = document.getElementById("viewer");
  if (!root || typeof uPlot === "undefined") return;
  var statusEl = document.getElementById("status");
  var chartEl = document.getElementById("chart");
  var rangeEl = document.getElementById("range");
  var img = document.getElementById("frame");
  var boxesEl = document.getElementById("boxes");
  var caption = document.getElementById("frame-caption");
  var video = document.getElementById("video");
  var PALETTE = ["#e6194b", "#3cb44b", "#c9a400", "#0082c8", "#f58230", "#911eb4", "#2ab7b7", "#d633c4",
                 "#7fa11a", "#c2185b", "#008080", "#6d4fb3"];
  var main = { url: root.dataset.timeline, doc: null };
  var other = null;           // {url, doc, label}
  var full = null;            // [start_s, end_s] of the whole run
  var view = null;            // [start_s, end_s] shown
  var plot = null;
  var cursorS = null;         // the video's time, drawn as a vertical line
  var fetchSeq = 0;

  function say(text, isError) { statusEl.textContent = text; statusEl.classList.toggle("error", !!isError); }
  function csrfHeaders() { var m = document.querySelector('meta[name="csrf-token"]'); return m ? { "X-CSRF-Token": m.content } : {}; }

  function width() { return Math.max(200, Math.floor(chartEl.clientWidth || 800)); }

  async function getTimeline(url, range) {
    var q = new URLSearchParams({ width: String(width()) });
    if (range) { q.set("start_s", String(range[0])); q.set("end_s", String(range[1])); }
    var r = await fetch(url + "?" + q.toString(), { credentials: "same-origin" });
    var doc = await r.json();
    if (!r.ok) throw new Error(doc.error || ("HTTP " + r.status));
    return doc;
  }

  // One run's doc -> [xs, per series: max ys, min ys], names; exact mode has min == max.
  function columns(doc) {
    var names = Object.keys(doc.series);
    var xs = doc.mode === "exact" ? doc.pts : doc.x;
    var cols = [xs];
    names.forEach(function (n) {
      var s = doc.series[n];
      if (doc.mode === "exact") { cols.push(s); cols.push(s); } else { cols.push(s.max); cols.push(s.min); }
    });
    return { names: names, data: cols };
  }

  // The frame behind a click at column idx: the extreme nearest the pointer among the series,
  // {pts} in exact mode, else {frame: its ordinal} (i0 + the extreme's offset in the column).
  function pick(doc, xIdx, yVal) {
    if (doc.mode === "exact") return { pts: doc.pts[xIdx] };
    var best = null, bestD = Infinity;
    Object.keys(doc.series).forEach(function (n) {
      var s = doc.series[n];
      [["max", "max_k"], ["min", "min_k"]].forEach(function (k) {
        var d = Math.abs(s[k[0]][xIdx] - yVal);
        if (d < bestD) { bestD = d; best = doc.i0[xIdx] + s[k[1]][xIdx]; }
      });
    });
    return { frame: best };
  }

  function drawSegments(u) {
    var ctx = u.ctx, top = u.bbox.top, h = u.bbox.height;
    var segs = (main.doc && main.doc.segments) || {};
    var names = Object.keys(segs);
    ctx.save();
    names.forEach(function (n, i) {
      ctx.fillStyle = n === "verdict" ? "rgba(200, 0, 0, 0.12)" : hexA(PALETTE[i % PALETTE.length], 0.10);
      segs[n].forEach(function (seg) {
        var x0 = u.valToPos(seg[0], "x", true), x1 = u.valToPos(seg[1], "x", true);
        ctx.fillRect(x0, top, Math.max(2, x1 - x0), h);
      });
    });
    if (cursorS !== null) {
      var x = u.valToPos(cursorS, "x", true);
      ctx.strokeStyle = "#000"; ctx.lineWidth = 2; ctx.beginPath(); ctx.moveTo(x, top); ctx.lineTo(x, top + h); ctx.stroke();
    }
    if (main.doc && main.doc.threshold != null) {
      var y = u.valToPos(main.doc.threshold, "y", true);
      ctx.setLineDash([6, 4]); ctx.strokeStyle = "#a40e26"; ctx.beginPath(); ctx.moveTo(u.bbox.left, y); ctx.lineTo(u.bbox.left + u.bbox.width, y); ctx.stroke();
    }
    ctx.restore();
  }

  function hexA(hex, a) {
    var n = parseInt(hex.slice(1), 16);
    return "rgba(" + (n >> 16) + "," + ((n >> 8) & 255) + "," + (n & 255) + "," + a + ")";
  }

  function build() {
    var a = columns(main.doc);
    var runs = [{ names: a.names, data: a.data, tag: "" }];
    if (other && other.doc) { var b = columns(other.doc); runs.push({ names: b.names, data: b.data, tag: other.label + " · " }); }
    var joined = runs.length > 1 ? uPlot.join(runs.map(function (r) { return r.data; })) : runs[0].data;
    var series = [{ label: "pts (s)" }], bands = [], k = 1;
    runs.forEach(function (run, ri) {
      run.names.forEach(function (n, i) {
        var colour = n === "verdict" ? (ri ? "#555" : "#000") : PALETTE[i % PALETTE.length];
        series.push({ label: run.tag + n, stroke: colour, width: n === "verdict" ? 2.5 : 1.25, dash: ri ? [5, 4] : undefined,
                      spanGaps: true, points: { show: false } });
        series.push({ label: run.tag + n + " (min)", stroke: "transparent", width: 0, spanGaps: true, points: { show: false } });
        bands.push({ series: [k, k + 1], fill: hexA(colour === "#000" || colour === "#555" ? "#000000" : colour, 0.08) });
        k += 2;
      });
    });
    var opts = {
      width: width(), height: window.innerWidth < 700 ? 240 : 320,
      series: series, bands: bands,
      scales: { x: { time: false }, y: { range: [0, 1.02] } },
      axes: [{ label: "pts (s)" }, { label: "score" }],
      legend: { show: true, live: true },
      cursor: { drag: { x: true, y: false, setScale: true } },
      hooks: { draw: [drawSegments], setSelect: [], setScale: [onScale] },
    };
    if (plot) plot.destroy();
    plot = new uPlot(opts, joined, chartEl);
    plot.over.addEventListener("click", onClick);
    plot.root.querySelectorAll(".u-legend th").forEach(function (th) { if (/\(min\)/.test(th.textContent)) th.parentNode.style.display = "none"; });
    chartEl.dataset.mode = main.doc.mode;
    chartEl.dataset.frames = String(main.doc.frames);
    chartEl.dataset.series = a.names.join(",");
    chartEl.dataset.drawn = String(Date.now());
    chartEl.dataset.overlay = other ? other.label : "";
    rangeEl.textContent = view[0].toFixed(2) + " – " + view[1].toFixed(2) + " s · " + main.doc.frames + " frames · " + (main.doc.mode === "exact" ? "every frame" : "min/max per pixel");
  }

  var settingScale = false, scaleTimer = null;
  function onScale(u, key) {
    if (key !== "x" || settingScale) return;
    var mn = u.scales.x.min, mx = u.scales.x.max;
    if (mn == null || mx == null) return;
    var lo = Math.max(full[0], mn), hi = Math.min(full[1], mx), eps = (full[1] - full[0]) * 1e-9;
    // uPlot reports the range load() just set after load() returns: the view shown already, not
    // a zoom (reloading it would rebuild the chart, which reports it again, every 120 ms)
    if (view && Math.abs(lo - view[0]) <= eps && Math.abs(hi - view[1]) <= eps) return;
    clearTimeout(scaleTimer);
    scaleTimer = setTimeout(function () { load([lo, hi]); }, 120);
  }

  async function load(range) {
    var seq = ++fetchSeq;
    try {
      var docs = await Promise.all([getTimeline(main.url, range), other ? getTimeline(other.url, range) : null]);
      if (seq !== fetchSeq) return;
      main.doc = docs[0];
      if (other) other.doc = docs[1];
      if (!full) full = [main.doc.meta.start_s || 0, main.doc.meta.end_s || 0];
      view = range || full;
      if (!main.doc.frames && main.doc.state && main.doc.state !== "succeeded" && main.doc.state !== "uploaded") {
        say("The job is " + main.doc.state + "; its results appear when it finishes.");
        setTimeout(function () { load(range); }, 2000);
      } else {
        say(main.doc.pipeline ? "Pipeline " + main.doc.pipeline + ", " + main.doc.meta.frames + " frames." : "Loaded.");
      }
      settingScale = true;
      build();
      plot.setScale("x", { min: view[0], max: view[1] === view[0] ? view[0] + 1 : view[1] });
      settingScale = false;
      if (main.doc.video && video.dataset.src !== main.doc.video) {
        video.dataset.src = main.doc.video; video.src = main.doc.video; document.getElementById("video-pane").hidden = false;
      }
    } catch (e) { if (seq === fetchSeq) say("Could not load the timeline: " + e.message, true); }
  }

  function zoom(f) {
    if (!view) return;
    var c = (view[0] + view[1]) / 2, h = Math.max(0.05, (view[1] - view[0]) * f / 2);
    load([Math.max(full[0], c - h), Math.min(full[1], c + h)]);
  }
  function pan(f) {
    if (!view) return;
    var w = view[1] - view[0], d = w * f;
    var a = Math.min(Math.max(full[0], view[0] + d), full[1] - w);
    load([a, a + w]);
  }

  async function onClick() {
    if (!plot || plot.cursor.idx == null || !main.doc.frame_url) return;
    var idx = plot.cursor.idx;
    var x = plot.data[0][idx];
    var mainIdx = (main.doc.mode === "exact" ? main.doc.pts : main.doc.x).indexOf(x);
    if (mainIdx < 0) return;
    var yVal = plot.posToVal(plot.cursor.top, "y");
    showFrame(pick(main.doc, mainIdx, yVal));
  }

  // which: {pts} (seconds) or {frame} (an ordinal into the run's frames); a number means {pts}.
  async function showFrame(which) {
    if (typeof which === "number") which = { pts: which };
    var q = which.frame != null ? "frame=" + which.frame : "pts_s=" + encodeURIComponent(which.pts);
    caption.textContent = "Decoding the frame " + (which.frame != null ? "#" + which.frame : "at " + which.pts.toFixed(3) + " s") + "…";
    try {
      var r = await fetch(main.doc.frame_url + "?" + q, { credentials: "same-origin" });
      if (!r.ok) { var e = await r.json(); throw new Error(e.error || ("HTTP " + r.status)); }
      var blob = await r.blob();
      var shown = r.headers.get("X-Frame-Pts"), size = (r.headers.get("X-Frame-Size") || "0x0").split("x").map(Number);
      var boxes = JSON.parse(r.headers.get("X-Frame-Boxes") || "[]");
      if (img.src) URL.revokeObjectURL(img.src);
      img.onload = function () { placeBoxes(boxes, size); };
      img.src = URL.createObjectURL(blob);
      img.hidden = false;
      img.dataset.pts = shown; img.dataset.requested = q; img.dataset.index = r.headers.get("X-Frame-Index");
      img.dataset.width = String(size[0]); img.dataset.height = String(size[1]);
      caption.textContent = "Frame " + r.headers.get("X-Frame-Index") + " at " + Number(shown).toFixed(3) + " s · " +
        boxes.length + " box(es): " + boxes.map(function (b) { return b.label + " " + b.score.toFixed(2); }).join(", ");
      img.alt = caption.textContent;
    } catch (e) { caption.textContent = "No frame: " + e.message; }
  }

  function placeBoxes(boxes, size) {
    boxesEl.textContent = "";
    var sx = img.clientWidth / (size[0] || img.naturalWidth), sy = img.clientHeight / (size[1] || img.naturalHeight);
    boxes.forEach(function (b) {
      var d = document.createElement("div");
      d.className = "box";
      d.dataset.box = b.box.join(",");
      d.dataset.label = b.label;
      d.style.left = (b.box[0] * sx) + "px"; d.style.top = (b.box[1] * sy) + "px";
      d.style.width = ((b.box[2] - b.box[0]) * sx) + "px"; d.style.height = ((b.box[3] - b.box[1]) * sy) + "px";
      boxesEl.appendChild(d);
    });
  }

  video.addEventListener("timeupdate", function () {
    cursorS = video.currentTime;
    chartEl.dataset.cursor = String(cursorS);
    if (plot) plot.redraw(false, false);
  });

  // -- overlay --------------------------------------------------------------------------------
  var pickJob = document.getElementById("compare-job");
  var pickFile = document.getElementById("compare-file");
  var cmpStatus = document.getElementById("compare-status");
  fetch("/v1/jobs?state=succeeded&limit=50", { credentials: "same-origin" }).then(function (r) { return r.ok ? r.json() : { jobs: [] }; })
    .then(function (doc) {
      (doc.jobs || doc.items || []).forEach(function (j) {
        if (j.id === root.dataset.id) return;
        var o = document.createElement("option"); o.value = j.id; o.textContent = j.id + " · " + j.pipeline; pickJob.appendChild(o);
      });
    }).catch(function () { /* the list is optional */ });
  pickJob.addEventListener("change", function () {
    if (!pickJob.value) return;
    other = { url: "/console/api/jobs/" + pickJob.value + "/timeline", doc: null, label: "job " + pickJob.value.slice(0, 8) };
    cmpStatus.textContent = "Overlaying job " + pickJob.value + ".";
    load(view);
  });
  pickFile.addEventListener("change", async function () {
    var f = pickFile.files[0]; if (!f) return;
    cmpStatus.textContent = "Uploading " + f.name + "…";
    try {
      var r = await fetch("/console/api/results", { method: "POST", body: f, credentials: "same-origin",
        headers: Object.assign({ "Content-Type": "application/json" }, csrfHeaders()) });
      var doc = await r.json(); if (!r.ok) throw new Error(doc.error || ("HTTP " + r.status));
      other = { url: "/console/api/results/" + doc.id + "/timeline", doc: null, label: f.name.slice(0, 24) };
      cmpStatus.textContent = "Overlaying " + f.name + ".";
      load(view);
    } catch (e) { cmpStatus.textContent = "Refused: " + e.message; }
  });
  document.getElementById("compare-clear").addEventListener("click", function () { other = null; cmpStatus.textContent = ""; pickJob.value = ""; load(view); });

  document.getElementById("zoom-in").addEventListener("click", function () { zoom(0.5); });
  document.getElementById("zoom-out").addEventListener("click", function () { zoom(2); });
  document.getElementById("pan-left").addEventListener("click", function () { pan(-0.5); });
  document.getElementById("pan-right").addEventListener("click", function () { pan(0.5); });
  document.getElementById("zoom-reset").addEventListener("click", function () { load(null); });
  chartEl.addEventListener("keydown", function (ev) {
    var m = { "+": function () { zoom(0.5); }, "-": function () { zoom(2); }, ArrowLeft: function () { pan(-0.25); }, ArrowRight: function () { pan(0.25); } };
    if (m[ev.key]) { ev.preventDefault(); m[ev.key](); }
  });
  var resizeTimer = null;
  window.addEventListener("resize", function () { clearTimeout(resizeTimer); resizeTimer = setTimeout(function () { load(view === full ? null : view); }, 200); });
  window.frameserveViewer = { showFrame: showFrame, load: load, plot: function () { return plot; }, doc: function () { return main.doc; } };
  load(null);
})();
