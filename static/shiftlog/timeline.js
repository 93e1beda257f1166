// Shiftlog: the run timeline (a canvas fed by timeline.json, charts by uPlot) and the run page
// opened at one event. No inline script or style anywhere: styles are set through element.style.
(function () {
  "use strict";

  // --- the run page at one event: bring the event into view, outlined and focused -------------
  function showTarget() {
    var stream = document.getElementById("stream");
    var id = stream && stream.getAttribute("data-target");
    var el = id && document.getElementById(id);
    if (!el) return;
    el.classList.add("ev-target");
    el.setAttribute("aria-current", "true");
    el.setAttribute("tabindex", "-1");
    el.scrollIntoView({ block: "center" });
    el.focus({ preventScroll: true });
  }

  var LABEL_W = 132, TOP = 30, LANE_H = 24, AXIS_H = 22;
  var COLORS = {
    turn: "#3056d3", tool: "#17866a", error: "#c23a3a", abandoned: "#b5bcc6",
    approval: "rgba(224, 165, 38, 0.22)", paused: "rgba(107, 63, 184, 0.16)",
    checkpoint: "#1c2430", rewind: "#6b3fb8", grid: "#e3e7ec", ink: "#1c2430", muted: "#6b7685",
    child: "#8a5a00"
  };

  function fmtMs(ms) {
    if (ms < 1000) return Math.round(ms) + " ms";
    if (ms < 60000) return (ms / 1000).toFixed(1) + " s";
    if (ms < 3600000) return (ms / 60000).toFixed(1) + " min";
    return (ms / 3600000).toFixed(1) + " h";
  }
  function fmtClock(ms) {
    var d = new Date(ms);
    return d.toISOString().slice(11, 19);
  }

  function Timeline(root) {
    this.root = root;
    this.canvas = document.getElementById("tl-canvas");
    this.tip = document.getElementById("tl-tip");
    this.sel = document.createElement("div");
    this.sel.className = "tl-sel";
    this.sel.hidden = true;
    this.canvas.parentNode.appendChild(this.sel);
    this.hits = [];
    this.data = null;
    this.draws = 0;
    this.charts = [];
    window.__timeline = { loads: [] };
    this.bind();
    this.load();
  }

  Timeline.prototype.params = function () {
    var q = new URLSearchParams(window.location.search);
    return { from: q.get("from"), to: q.get("to") };
  };

  Timeline.prototype.width = function () {
    var w = Math.round(this.canvas.parentNode.clientWidth - LABEL_W);
    return Math.max(200, Math.min(4000, w));
  };

  Timeline.prototype.go = function (from, to) {
    var q = new URLSearchParams(window.location.search);
    if (from === null) { q.delete("from"); q.delete("to"); }
    else { q.set("from", String(from)); q.set("to", String(to)); }
    var s = q.toString();
    history.pushState(null, "", window.location.pathname + (s ? "?" + s : ""));
    this.load();
  };

  Timeline.prototype.load = function () {
    var self = this, p = this.params();
    var u = new URL(this.root.getAttribute("data-json"), window.location.href);
    if (p.from) u.searchParams.set("from", p.from);
    if (p.to) u.searchParams.set("to", p.to);
    u.searchParams.set("width", String(this.width()));
    var t0 = performance.now();
    document.getElementById("tl-window").textContent = "Loading…";
    fetch(u.toString(), { credentials: "same-origin", headers: { Accept: "application/json" } })
      .then(function (r) { return r.json().then(function (body) { return { ok: r.ok, body: body }; }); })
      .then(function (res) {
        if (!res.ok) {
          document.getElementById("tl-window").textContent = res.body.error || "Could not load the timeline.";
          return;
        }
        var t1 = performance.now();
        self.data = res.body;
        self.draw();
        self.table();
        self.drawCharts();
        var t2 = performance.now();
        window.__timeline.loads.push({
          fetch_ms: t1 - t0, draw_ms: t2 - t1, total_ms: t2 - t0,
          server_ms: res.body.server_ms, mode: res.body.window.mode
        });
        self.draws += 1;
        self.root.setAttribute("data-drawn", String(self.draws));
        document.getElementById("tl-server").textContent =
          "Server: " + res.body.server_ms + " ms · fetched and drawn in " + Math.round(t2 - t0) + " ms";
      })
      .catch(function (e) {
        document.getElementById("tl-window").textContent = "Could not load the timeline: " + e;
      });
  };

  Timeline.prototype.x = function (ms) {
    var w = this.data.window;
    return LABEL_W + (ms - w.start_ms) / (w.end_ms - w.start_ms) * this.plotW;
  };

  // The canvas follows the page's colours (light or dark): resolve the stylesheet's variables
  // through a probe element (a custom property read directly is not resolved).
  function themeColors() {
    var probe = document.createElement("span");
    document.body.appendChild(probe);
    [["ink", "--ink"], ["muted", "--muted"], ["grid", "--line"], ["checkpoint", "--ink"]].forEach(function (pair) {
      probe.style.color = "var(" + pair[1] + ")";
      var value = getComputedStyle(probe).color;
      if (value) COLORS[pair[0]] = value;
    });
    probe.remove();
  }

  // uPlot's axes in the page's colours (its defaults are black on whatever is behind).
  function plot(opts, data, el) {
    themeColors();
    (opts.axes || []).forEach(function (axis) {
      axis.stroke = axis.stroke || COLORS.ink;
      axis.grid = axis.grid || { stroke: COLORS.grid, width: 1 };
      axis.ticks = axis.ticks || { stroke: COLORS.grid, width: 1 };
    });
    return new uPlot(opts, data, el);
  }

  Timeline.prototype.draw = function () {
    themeColors();
    var d = this.data, w = d.window, c = this.canvas;
    var cssW = this.canvas.parentNode.clientWidth;
    var kids = d.children ? d.children.lanes : [];
    var lanes = Math.max(1, d.lanes.length) + kids.length;
    var cssH = TOP + lanes * LANE_H + AXIS_H;
    var dpr = window.devicePixelRatio || 1;
    c.style.height = cssH + "px";
    c.width = Math.round(cssW * dpr);
    c.height = Math.round(cssH * dpr);
    var g = c.getContext("2d");
    g.setTransform(dpr, 0, 0, dpr, 0, 0);
    g.clearRect(0, 0, cssW, cssH);
    this.plotW = cssW - LABEL_W - 8;
    this.hits = [];
    var self = this, bottom = TOP + lanes * LANE_H;
    var ownBottom = TOP + Math.max(1, d.lanes.length) * LANE_H;

    // the run's own waits, shaded across its own lanes (a fleet's children lanes are below)
    d.spans.forEach(function (s) {
      var x0 = Math.max(LABEL_W, self.x(s.start)), x1 = Math.min(LABEL_W + self.plotW, self.x(s.end));
      g.fillStyle = COLORS[s.kind];
      g.fillRect(x0, TOP, Math.max(1, x1 - x0), ownBottom - TOP);
      self.hits.push({ x: x0, y: TOP, w: Math.max(3, x1 - x0), h: ownBottom - TOP, span: s, back: true });
    });
    // lanes
    g.font = "12px system-ui, sans-serif";
    g.textBaseline = "middle";
    d.lanes.forEach(function (lane, i) {
      var y = TOP + i * LANE_H;
      g.fillStyle = COLORS.grid;
      g.fillRect(LABEL_W, y + LANE_H - 1, self.plotW, 1);
      g.fillStyle = COLORS.ink;
      g.fillText(lane.label, 6, y + LANE_H / 2, LABEL_W - 10);
    });
    if (w.mode === "detail") {
      d.items.forEach(function (it) { self.bar(g, it); });
    } else {
      var maxN = 1;
      d.buckets.forEach(function (b) { if (b.n > maxN) maxN = b.n; });
      var bw = Math.max(1, this.plotW / (w.width / 4));
      d.buckets.forEach(function (b) {
        var x = self.x(w.start_ms + b.b * w.bucket_ms), y = TOP + b.lane * LANE_H + 3;
        var a = 0.12 + 0.78 * Math.log(1 + b.n) / Math.log(1 + maxN);
        g.globalAlpha = a;
        g.fillStyle = b.abandoned === b.n ? COLORS.abandoned : COLORS.turn;
        g.fillRect(x, y, Math.max(1, bw - 0.5), LANE_H - 7);
        g.globalAlpha = 1;
        if (b.errors) { g.fillStyle = COLORS.error; g.fillRect(x, y - 2, Math.max(1, bw - 0.5), 2); }
        self.hits.push({ x: x, y: y, w: Math.max(2, bw), h: LANE_H - 7, bucket: b, back: true });
        self.bar(g, b.longest, true);
      });
    }
    if (kids.length) this.drawChildren(g, ownBottom);
    // checkpoints: diamonds in a row above the lanes; rewinds: an arc back to their checkpoint
    d.checkpoints.forEach(function (m) {
      var x = self.x(m.ms), y = TOP / 2 + 4;
      g.fillStyle = m.abandoned ? COLORS.abandoned : COLORS.checkpoint;
      g.beginPath(); g.moveTo(x, y - 5); g.lineTo(x + 5, y); g.lineTo(x, y + 5); g.lineTo(x - 5, y);
      g.closePath(); g.fill();
      self.hits.push({ x: x - 5, y: y - 5, w: 10, h: 10, checkpoint: m });
    });
    d.rewinds.forEach(function (r) {
      var x0 = self.x(r.ms), x1 = self.x(r.to_ms), y = TOP / 2 + 4;
      g.strokeStyle = COLORS.rewind; g.lineWidth = 1.5;
      g.beginPath(); g.moveTo(x0, y); g.quadraticCurveTo((x0 + x1) / 2, y - 22, x1, y); g.stroke();
      g.beginPath(); g.moveTo(x1, y); g.lineTo(x1 + 6, y - 5); g.lineTo(x1 + 7, y + 1); g.closePath();
      g.fillStyle = COLORS.rewind; g.fill();
      self.hits.push({ x: Math.min(x0, x1), y: 0, w: Math.abs(x0 - x1) + 4, h: TOP - 4, rewind: r, back: true });
    });
    // the time axis
    g.fillStyle = COLORS.muted; g.textBaseline = "top";
    var ticks = Math.max(2, Math.floor(this.plotW / 140));
    for (var k = 0; k <= ticks; k++) {
      var ms = w.start_ms + (w.end_ms - w.start_ms) * k / ticks, x = this.x(ms);
      g.fillRect(x, bottom, 1, 4);
      g.textAlign = k === 0 ? "left" : k === ticks ? "right" : "center";
      g.fillText(fmtClock(ms), x, bottom + 6);
    }
    g.textAlign = "left";
    this.describe();
  };

  // A fleet's children, one lane each below a line: their turns and calls in blocks of the
  // window's stretches, darker for more; a click opens the child's run page at that event.
  Timeline.prototype.drawChildren = function (g, top) {
    var d = this.data, w = d.window, self = this, kids = d.children;
    g.fillStyle = COLORS.ink;
    g.fillRect(0, top - 1, LABEL_W + this.plotW, 2);
    kids.lanes.forEach(function (lane) {
      var y = self.childY(lane.id);
      g.fillStyle = COLORS.grid;
      g.fillRect(LABEL_W, y + LANE_H - 1, self.plotW, 1);
      g.fillStyle = COLORS.ink;
      g.fillText(lane.label, 6, y + LANE_H / 2, LABEL_W - 10);
      self.hits.push({ x: 0, y: y, w: LABEL_W - 4, h: LANE_H, childLane: lane });
    });
    var maxN = 1;
    kids.blocks.forEach(function (b) { if (b.n > maxN) maxN = b.n; });
    var bw = Math.max(2, this.plotW / (w.width / 4));
    kids.blocks.forEach(function (b) {
      var x = self.x(w.start_ms + b.b * w.bucket_ms), y = self.childY(b.lane) + 4;
      g.globalAlpha = 0.3 + 0.7 * Math.log(1 + b.n) / Math.log(1 + maxN);
      g.fillStyle = COLORS.child;
      g.fillRect(x, y, Math.max(2, bw - 0.5), LANE_H - 9);
      g.globalAlpha = 1;
      if (b.errors) { g.fillStyle = COLORS.error; g.fillRect(x, y - 2, Math.max(2, bw - 0.5), 2); }
      self.hits.push({ x: x, y: y, w: Math.max(4, bw), h: LANE_H - 9, childBlock: b });
    });
  };

  // Child lanes come after the run's own (at least one row, even when it has no lane).
  Timeline.prototype.childY = function (id) {
    var own = this.data.lanes.length;
    return TOP + (Math.max(1, own) + id - own) * LANE_H;
  };

  Timeline.prototype.childLane = function (id) {
    var lanes = this.data.children.lanes;
    for (var i = 0; i < lanes.length; i++) if (lanes[i].id === id) return lanes[i];
    return null;
  };

  Timeline.prototype.childUrl = function (runId, seq) {
    var own = "/runs/" + this.root.getAttribute("data-run") + "/";
    return this.eventUrl(seq).replace(own, "/runs/" + runId + "/");
  };

  Timeline.prototype.bar = function (g, it, longest) {
    var w = this.data.window, y = TOP + it.lane * LANE_H + (it.kind === "turn" ? 4 : 12);
    var end = it.end === null ? w.end_ms : it.end;
    var x0 = Math.max(LABEL_W, this.x(it.start)), x1 = Math.min(LABEL_W + this.plotW, this.x(end));
    var bw = Math.max(2, x1 - x0);
    g.fillStyle = it.abandoned ? COLORS.abandoned : it.error ? COLORS.error : COLORS[it.kind];
    g.fillRect(x0, y, bw, 7);
    if (longest) { g.strokeStyle = "#fff"; g.lineWidth = 1; g.strokeRect(x0, y, bw, 7); }
    if (it.running) { g.fillStyle = COLORS.ink; g.fillRect(x0 + bw - 1, y - 3, 2, 13); }
    this.hits.push({ x: x0, y: y - 1, w: Math.max(4, bw), h: 9, item: it });
  };

  Timeline.prototype.describe = function () {
    var d = this.data, w = d.window, c = w.counts;
    var text = "Run " + d.run.id + ", events #" + w.from + " to #" + w.to + ": " + c.lanes + " lane" +
      (c.lanes === 1 ? "" : "s") + ", " + c.items + " model turns and tool calls (" + c.errors +
      " error" + (c.errors === 1 ? "" : "s") + "), " + d.spans.length + " waits, " +
      d.checkpoints_total + " checkpoints, " + d.rewinds.length + " rewinds; " +
      (w.mode === "detail" ? "shown one by one" : "shown as blocks per lane (zoom in for each one)") +
      (d.children ? "; " + d.children.lanes.length + " child run" + (d.children.lanes.length === 1 ? "" : "s") +
        " as lanes below" + (d.children.total > d.children.lanes.length ? " (of " + d.children.total + ")" : "") : "");
    this.canvas.setAttribute("aria-label", "Timeline of " + text);
    document.getElementById("tl-window").textContent = "#" + w.from + "–#" + w.to + " of " +
      d.run.last_seq + " · " + fmtClock(w.start_ms) + "–" + fmtClock(w.end_ms) + " UTC · " +
      c.items + " items, " + c.errors + " errors · " + (w.mode === "detail" ? "each item" : "blocks");
  };

  Timeline.prototype.eventUrl = function (seq) {
    return this.root.getAttribute("data-event-url").replace(/0\/$/, seq + "/");
  };

  Timeline.prototype.table = function () {
    var d = this.data, body = document.getElementById("tl-table"), self = this;
    body.textContent = "";
    function row(cells, seq) {
      var tr = document.createElement("tr");
      cells.forEach(function (text) {
        var td = document.createElement("td"); td.textContent = text; tr.appendChild(td);
      });
      var td = document.createElement("td"), a = document.createElement("a");
      a.href = self.eventUrl(seq); a.textContent = "#" + seq; td.appendChild(a); tr.appendChild(td);
      body.appendChild(tr);
      return tr;
    }
    function what(it) {
      return (it.kind === "turn" ? "model turn (" + it.name + ")" : "tool call " + it.name) +
        (it.error ? ", error" : "") + (it.running ? ", still running" : "") + (it.abandoned ? ", abandoned by a rewind" : "");
    }
    function lasts(it) { return it.end === null ? "running" : fmtMs(it.end - it.start); }
    var lanes = d.lanes.map(function (l) { return l.label; });
    if (d.window.mode === "detail") {
      d.items.forEach(function (it) { row([lanes[it.lane], what(it), fmtClock(it.start), lasts(it)], it.seq); });
    } else {
      d.buckets.forEach(function (b) {
        row([lanes[b.lane], b.n + " items, " + b.errors + " errors; longest: " + what(b.longest),
             fmtClock(d.window.start_ms + b.b * d.window.bucket_ms), fmtMs(b.longest.ms)], b.longest.seq);
      });
    }
    d.checkpoints.forEach(function (m) {
      row(["checkpoints", "checkpoint " + m.id + " (" + m.kind + (m.label ? ": " + m.label : "") + ")", fmtClock(m.ms), ""], m.seq);
    });
    d.rewinds.forEach(function (r) {
      row(["rewinds", "rewind to checkpoint " + r.checkpoint_id + " (#" + r.to_seq + ")", fmtClock(r.ms), ""], r.seq);
    });
    if (d.children) {
      d.children.blocks.forEach(function (b) {
        var lane = self.childLane(b.lane);
        var tr = row([lane.label, b.n + " turns and calls, " + b.errors + " errors (session" +
          (b.sessions[0] === b.sessions[1] ? " " + b.sessions[0] : "s " + b.sessions[0] + "–" + b.sessions[1]) + ")",
          fmtClock(d.window.start_ms + b.b * d.window.bucket_ms), ""], b.seq);
        tr.querySelector("a").href = self.childUrl(lane.run_id, b.seq);
      });
    }
    d.spans.forEach(function (s) {
      row(["waits", s.kind === "approval" ? "waiting for a person" : "paused", fmtClock(s.start), fmtMs(s.end - s.start)], s.seq);
    });
  };

  Timeline.prototype.hitAt = function (x, y) {
    var best = null;
    for (var i = this.hits.length - 1; i >= 0; i--) {
      var h = this.hits[i];
      if (x >= h.x && x <= h.x + h.w && y >= h.y && y <= h.y + h.h) {
        if (!h.back) return h;
        if (!best) best = h;
      }
    }
    return best;
  };

  Timeline.prototype.tipText = function (h) {
    if (h.item) {
      var it = h.item;
      return (it.kind === "turn" ? "Model turn · " : "Tool call · ") + it.name + "\n#" + it.seq +
        " · session " + it.session + " · " + (it.end === null ? "still running" : fmtMs(it.end - it.start)) +
        (it.error ? " · error" : "") + (it.abandoned ? " · abandoned by a rewind" : "");
    }
    if (h.bucket) {
      var b = h.bucket;
      return b.n + " items · " + b.errors + " errors" + (b.abandoned ? " · " + b.abandoned + " abandoned" : "") +
        "\nlongest: " + b.longest.name + " " + fmtMs(b.longest.ms) + " (#" + b.longest.seq + ")\nclick to zoom in";
    }
    if (h.childBlock) {
      var cb = h.childBlock, lane = this.childLane(cb.lane);
      return (lane ? lane.label + " (" + lane.status.replace(/_/g, " ") + ")" : "child") + " · " + cb.n +
        " turns and calls · " + cb.errors + " errors\nsession" + (cb.sessions[0] === cb.sessions[1] ? " " + cb.sessions[0] : "s " + cb.sessions[0] + "–" + cb.sessions[1]) +
        " · click to open it at #" + cb.seq;
    }
    if (h.childLane) return h.childLane.label + " · " + h.childLane.status.replace(/_/g, " ") + "\nclick to open its page";
    if (h.checkpoint) return "Checkpoint " + h.checkpoint.id + " · " + h.checkpoint.kind + (h.checkpoint.label ? " · " + h.checkpoint.label : "") + "\n#" + h.checkpoint.seq;
    if (h.rewind) return "Rewind to checkpoint " + h.rewind.checkpoint_id + " (#" + h.rewind.to_seq + ")\nabandoned #" + (h.rewind.to_seq + 1) + "–#" + h.rewind.from_seq;
    if (h.span) return (h.span.kind === "approval" ? "Waiting for a person" : "Paused") + " · " + fmtMs(h.span.end - h.span.start) + (h.span.merged > 1 ? " (" + h.span.merged + " waits)" : "");
    return "";
  };

  Timeline.prototype.seqAtX = function (x) {
    var w = this.data.window, seqs = w.bucket_seqs;
    var k = Math.floor((x - LABEL_W) / this.plotW * (seqs.length - 1));
    return seqs[Math.max(0, Math.min(seqs.length - 1, k))];
  };

  Timeline.prototype.zoomTo = function (x0, x1) {
    var a = this.seqAtX(Math.min(x0, x1)), b = this.seqAtX(Math.max(x0, x1) + 1);
    var w = this.data.window;
    if (b <= a) b = Math.min(w.to, a + 1);
    if (a === w.from && b === w.to) { a = Math.min(w.to - 1, a + 1); }
    this.go(Math.max(1, a), Math.max(a, b));
  };

  Timeline.prototype.key = function (act) {
    if (!this.data) return;
    var w = this.data.window, last = this.data.run.last_seq, span = w.to - w.from;
    if (act === "reset") return this.go(null);
    if (act === "zoom-in") {
      var q = Math.floor(span / 4);
      if (span < 4) return;
      return this.go(w.from + q, w.to - q);
    }
    if (act === "zoom-out") {
      var grow = Math.max(2, Math.ceil(span / 2));
      return this.go(Math.max(1, w.from - grow), Math.min(last, w.to + grow));
    }
    var step = Math.max(1, Math.ceil(span / 2));
    if (act === "left" && w.from > 1) {
      var f = Math.max(1, w.from - step);
      return this.go(f, f + span);
    }
    if (act === "right" && w.to < last) {
      var t = Math.min(last, w.to + step);
      return this.go(Math.max(1, t - span), t);
    }
  };

  Timeline.prototype.bind = function () {
    var self = this, c = this.canvas, down = null;
    function pos(e) { var r = c.getBoundingClientRect(); return { x: e.clientX - r.left, y: e.clientY - r.top }; }
    c.addEventListener("mousedown", function (e) {
      var p = pos(e);
      var label = p.x < LABEL_W && self.data && self.hitAt(p.x, p.y);
      if (label && label.childLane) {  // a child's lane label: its run page
        window.location.href = self.root.getAttribute("data-run-url").replace(
          "/runs/" + self.root.getAttribute("data-run") + "/", "/runs/" + label.childLane.run_id + "/");
        return;
      }
      if (p.x >= LABEL_W && self.data) down = p;
    });
    window.addEventListener("mousemove", function (e) {
      if (!self.data) return;
      var p = pos(e);
      if (down) {
        var x0 = Math.max(LABEL_W, Math.min(down.x, p.x)), x1 = Math.min(LABEL_W + self.plotW, Math.max(down.x, p.x));
        if (x1 - x0 > 3) {
          self.sel.hidden = false;
          self.sel.style.left = x0 + "px"; self.sel.style.width = (x1 - x0) + "px";
          self.sel.style.top = TOP + "px"; self.sel.style.height = (c.clientHeight - TOP - AXIS_H) + "px";
        }
      }
      if (e.target !== c) { self.tip.hidden = true; return; }
      var h = self.hitAt(p.x, p.y);
      c.classList.toggle("pointing", Boolean(h && (h.item || h.bucket || h.checkpoint || h.rewind || h.childBlock || h.childLane)));
      if (!h) { self.tip.hidden = true; return; }
      self.tip.textContent = self.tipText(h);
      self.tip.hidden = false;
      self.tip.style.left = Math.min(p.x + 12, c.clientWidth - 260) + "px";
      self.tip.style.top = (p.y + 14) + "px";
    });
    window.addEventListener("mouseup", function (e) {
      if (!down) return;
      var p = pos(e), start = down;
      down = null;
      self.sel.hidden = true;
      if (Math.abs(p.x - start.x) > 5) { self.zoomTo(start.x, p.x); return; }
      var h = self.hitAt(p.x, p.y);
      if (!h) return;
      if (h.childBlock) {
        window.location.href = self.childUrl(self.childLane(h.childBlock.lane).run_id, h.childBlock.seq);
        return;
      }
      var seq = h.item ? h.item.seq : h.checkpoint ? h.checkpoint.seq : h.rewind ? h.rewind.seq : null;
      if (seq !== null) { window.location.href = self.eventUrl(seq); return; }
      if (h.bucket) {
        var w = self.data.window, bx = self.x(w.start_ms + h.bucket.b * w.bucket_ms);
        self.zoomTo(bx, bx + Math.max(4, self.plotW / (w.width / 4)));
      }
    });
    c.addEventListener("mouseleave", function () { self.tip.hidden = true; });
    document.querySelectorAll("#timeline [data-act]").forEach(function (b) {
      b.addEventListener("click", function () { self.key(b.getAttribute("data-act")); });
    });
    document.addEventListener("keydown", function (e) {
      if (e.target && /INPUT|TEXTAREA|SELECT/.test(e.target.tagName)) return;
      if (e.ctrlKey || e.metaKey || e.altKey) return;
      var act = { "+": "zoom-in", "=": "zoom-in", "-": "zoom-out", "−": "zoom-out", ArrowLeft: "left",
                  ArrowRight: "right", "0": "reset" }[e.key];
      if (act) { e.preventDefault(); self.key(act); }
    });
    window.addEventListener("popstate", function () { self.load(); });
    var resized = null, lastWidth = this.width();
    window.addEventListener("resize", function () {
      clearTimeout(resized);
      resized = setTimeout(function () {
        if (self.width() !== lastWidth) { lastWidth = self.width(); self.load(); }
      }, 250);
    });
  };

  // --- charts (uPlot) --------------------------------------------------------------------------
  Timeline.prototype.drawCharts = function () {
    if (typeof uPlot === "undefined") return;
    this.charts.forEach(function (u) { u.destroy(); });
    this.charts = [];
    var ch = this.data.charts;
    this.charts.push(usageChart(ch.usage), sessionsChart(ch.sessions), toolsChart(ch.tools));
  };

  function compact(v) {
    if (v >= 1e9) return (v / 1e9) + "G";
    if (v >= 1e6) return (v / 1e6) + "M";
    if (v >= 1e3) return (v / 1e3) + "k";
    return String(v);
  }

  function chartWidth(el) { return Math.max(240, el.clientWidth || 400); }

  function usageChart(u) {
    var el = document.getElementById("chart-usage");
    el.textContent = "";
    var x = u.t.map(function (t) { return t / 1000; });
    var series = [{}, { label: "tokens", scale: "tokens", stroke: COLORS.turn, width: 2 },
                  { label: "dollars", scale: "usd", stroke: COLORS.tool, width: 2, value: function (_, v) { return v === null ? "" : "$" + v.toFixed(4); } }];
    var data = [x, u.tokens, u.cost];
    if (u.max_tokens) {
      series.push({ label: "token budget", scale: "tokens", stroke: COLORS.turn, dash: [6, 4], width: 1 });
      data.push(x.map(function () { return u.max_tokens; }));
    }
    if (u.max_cost_usd) {
      series.push({ label: "dollar budget", scale: "usd", stroke: COLORS.tool, dash: [6, 4], width: 1 });
      data.push(x.map(function () { return u.max_cost_usd; }));
    }
    var note = document.getElementById("chart-usage-note");
    note.textContent = "Cumulative for the run up to each point; dashed: the budget" +
      (u.max_tokens || u.max_cost_usd ? "." : " (this run has none).");
    return plot({
      width: chartWidth(el), height: 220, series: series,
      scales: { x: { time: true }, tokens: { range: function (_, lo, hi) { return [0, Math.max(hi, u.max_tokens || 0) * 1.05 || 1]; } },
                usd: { range: function (_, lo, hi) { return [0, Math.max(hi, u.max_cost_usd || 0) * 1.05 || 1]; } } },
      axes: [{}, { scale: "tokens", size: 60, values: function (_, vals) { return vals.map(compact); } },
             { scale: "usd", side: 1, size: 60, grid: { show: false },
               values: function (_, vals) { return vals.map(function (v) { return "$" + v; }); } }]
    }, data, el);
  }

  function barsChart(el, what, labels, series, data) {
    el.textContent = "";
    var idx = labels.map(function (_, i) { return i; });
    return plot({
      width: chartWidth(el), height: 200,
      scales: { x: { time: false, range: [-0.6, Math.max(0.6, labels.length - 0.4)] } },
      series: [{ label: what, value: function (_, i) { return i === null ? "" : labels[i] || ""; } }].concat(series),
      axes: [{ splits: function () { return idx; }, values: function (_, s) { return s.map(function (i) { return labels[i] || ""; }); },
               rotate: labels.length > 5 ? -50 : 0, size: labels.length > 5 ? 80 : 40 }, { size: 60 }]
    }, [idx].concat(data), el);
  }

  function sessionsChart(rows) {
    var el = document.getElementById("chart-sessions");
    return barsChart(el, "session", rows.map(function (r) { return r.label; }),
      [{ label: "dollars", stroke: COLORS.tool, fill: "rgba(23, 134, 106, 0.35)", paths: uPlot.paths.bars({ size: [0.7, 40] }),
         value: function (_, v) { return v === null ? "" : "$" + v.toFixed(4); } }],
      [rows.map(function (r) { return r.cost; })]);
  }

  function toolsChart(t) {
    var el = document.getElementById("chart-tools");
    document.getElementById("chart-tools-note").textContent = t.sampled
      ? "A sample: " + t.calls + " finished calls taken evenly from the window."
      : t.calls + " finished calls in the window.";
    return barsChart(el, "tool", t.rows.map(function (r) { return r.name; }),
      [{ label: "median", stroke: COLORS.turn, fill: "rgba(48, 86, 211, 0.4)", paths: uPlot.paths.bars({ size: [0.35, 30], align: -1 }),
         value: function (_, v) { return v === null ? "" : fmtMs(v); } },
       { label: "p90", stroke: COLORS.rewind, fill: "rgba(107, 63, 184, 0.35)", paths: uPlot.paths.bars({ size: [0.35, 30], align: 1 }),
         value: function (_, v) { return v === null ? "" : fmtMs(v); } }],
      [t.rows.map(function (r) { return r.median_ms; }), t.rows.map(function (r) { return r.p90_ms; })]);
  }

  document.addEventListener("DOMContentLoaded", function () {
    showTarget();
    var root = document.getElementById("timeline");
    if (root) window.__timelineView = new Timeline(root);
  });
})();
