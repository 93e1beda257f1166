// Shiftlog: the small bit of glue htmx's ws extension needs for a gap-free live page.
(function () {
  "use strict";
  var opened = false;

  function maxSeq() {
    var max = 0;
    document.querySelectorAll("#events [data-seq]").forEach(function (el) {
      var seq = parseInt(el.getAttribute("data-seq"), 10);
      if (seq > max) max = seq;
    });
    return max;
  }

  // The ws-connect URL is read once; a reconnect must ask for what came after the newest event
  // the page holds now, not after the one it held when it loaded (that would replay, doubled).
  htmx.createWebSocket = function (url) {
    var u = new URL(url, window.location.href);
    u.protocol = window.location.protocol === "https:" ? "wss:" : "ws:";
    if (document.getElementById("events")) u.searchParams.set("after", String(maxSeq()));
    if (opened) u.searchParams.set("reconnect", "1");
    var socket = new WebSocket(u.toString(), []);
    socket.binaryType = htmx.config.wsBinaryType;
    return socket;
  };

  function setState(text, cls) {
    var el = document.getElementById("live-state");
    if (!el) return;
    el.textContent = text;
    el.className = "live-state " + cls;
  }

  // A rewind that arrives live turns the events after its checkpoint into an abandoned branch:
  // mark the rows (and checkpoints) the page already holds, as the server does on a fresh load.
  function markAbandoned() {
    document.querySelectorAll("#events .ev[data-abandons]:not([data-applied])").forEach(function (ev) {
      var range = ev.getAttribute("data-abandons").split("-");
      var after = parseInt(range[0], 10), upto = parseInt(range[1], 10);
      ev.setAttribute("data-applied", "1");
      document.querySelectorAll("#events .ev[data-seq]").forEach(function (row) {
        var seq = parseInt(row.getAttribute("data-seq"), 10);
        if (seq > after && seq <= upto && !row.classList.contains("abandoned")) {
          row.classList.add("abandoned");
          var badge = document.createElement("span");
          badge.className = "badge abandoned-badge";
          badge.textContent = "abandoned by rewind";
          var meta = row.querySelector(".ev-meta");
          if (meta) meta.appendChild(badge);
        }
      });
    });
  }
  document.addEventListener("DOMContentLoaded", markAbandoned);

  // The run page opens at the newest event (the stream's bottom).
  document.addEventListener("DOMContentLoaded", function () {
    var s = document.getElementById("stream");
    if (s) s.scrollTop = s.scrollHeight;
  });

  // "Close" on a checkpoint panel opened in the page empties the panel instead of leaving it
  // (the link still works without script, or when the panel is a page of its own).
  document.addEventListener("click", function (e) {
    var link = e.target.closest && e.target.closest("[data-close-panel]");
    var panel = document.querySelector("main > .detail #checkpoint-action");
    if (link && panel && panel.contains(link)) {
      e.preventDefault();
      panel.innerHTML = "";
    }
  });
  document.addEventListener("htmx:afterSwap", markAbandoned);

  // A box that scrolls sideways (a diff's long line) can be scrolled from the keyboard.
  function focusableScrollers() {
    document.querySelectorAll("pre:not([tabindex])").forEach(function (pre) {
      if (pre.scrollWidth > pre.clientWidth) pre.tabIndex = 0;
    });
  }
  document.addEventListener("DOMContentLoaded", focusableScrollers);
  document.addEventListener("htmx:afterSettle", focusableScrollers);

  var stuckToBottom = true;
  document.addEventListener("htmx:wsOpen", function () { opened = true; setState("live", "on"); });
  document.addEventListener("htmx:wsClose", function () { setState("reconnecting…", "retry"); });
  document.addEventListener("htmx:wsBeforeMessage", function () {
    var s = document.getElementById("stream");
    stuckToBottom = !s || s.scrollHeight - s.scrollTop - s.clientHeight < 80;
  });
  document.addEventListener("htmx:wsAfterMessage", function () {
    markAbandoned();
    var s = document.getElementById("stream");
    if (s && stuckToBottom) s.scrollTop = s.scrollHeight;
    var rows = document.getElementById("run-rows");
    if (rows && rows.querySelector("tr[id^=run-]")) {
      var empty = rows.querySelector("tr.empty");
      if (empty) empty.remove();
    }
    var list = document.getElementById("approval-list");
    // A card pushed live joins its run's section (or the run's earlier arrivals), so one run
    // asking for many calls does not push another's cards down the page.
    Array.prototype.forEach.call(list ? list.querySelectorAll(":scope > .approval-arrived") : [], function (box) {
      var into = document.getElementById("approval-run-" + box.getAttribute("data-run") + "-cards");
      if (!into) {
        var earlier = list.querySelectorAll(":scope > .approval-arrived[data-run='" + box.getAttribute("data-run") + "']");
        into = earlier.length > 1 ? earlier[earlier.length - 1] : null;
      }
      if (!into || into === box) return;
      while (box.firstChild) into.appendChild(box.firstChild);
      box.remove();
    });
    if (list && list.querySelector(".approval")) {
      var none = document.getElementById("no-approvals");
      if (none) none.remove();
    }
  });
})();

// A link to an event (#seq-N) that the run page does not hold (it shows the newest events):
// open the run page at that event instead (/runs/ID/events/N/).
(function () {
  "use strict";
  function follow() {
    var m = /^#seq-(\d+)$/.exec(window.location.hash);
    var stream = document.querySelector("#stream[data-events-url]");
    if (!m || !stream || document.getElementById("seq-" + m[1])) return;
    window.location.replace(stream.getAttribute("data-events-url") + m[1] + "/#seq-" + m[1]);
  }
  document.addEventListener("DOMContentLoaded", follow);
  window.addEventListener("hashchange", follow);
})();

// The new-run form's policy rows: "Add a rule" appends a row from the formset's empty form.
(function () {
  "use strict";
  document.addEventListener("click", function (e) {
    var button = e.target.closest && e.target.closest("#policy-rows .add-rule");
    if (!button) return;
    var total = document.querySelector("#policy-rows input[name=rules-TOTAL_FORMS]");
    var template = document.getElementById("rule-template");
    var n = parseInt(total.value, 10);
    var row = template.innerHTML.replace(/__prefix__/g, String(n));
    document.getElementById("rule-rows").insertAdjacentHTML("beforeend", row);
    total.value = String(n + 1);
    var first = document.querySelector("#rule-rows tr:last-child input");
    if (first) first.focus();
  });
})();

// The new-run form: the heartbeat is an external agent's alone, shown when that is the provider
// (without script the field is always there, and ignored for the others).
(function () {
  "use strict";
  function sync() {
    var provider = document.querySelector("form select[name=provider]");
    var field = document.getElementById("field-heartbeat_seconds");
    if (!provider || !field) return;
    field.hidden = provider.value !== "external";
  }
  document.addEventListener("DOMContentLoaded", sync);
  document.addEventListener("change", function (e) {
    if (e.target && e.target.matches && e.target.matches("select[name=provider]")) sync();
  });
})();
