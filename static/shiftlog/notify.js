// Shiftlog: approvals waiting, seen from another tab. The tab's title always carries the header's
// count ("(2) Runs · Shiftlog"); with "Notify me" on (and the browser's permission), a rise of the
// count pushed over the socket shows a notification too.
(function () {
  "use strict";
  var KEY = "shiftlog-notify";
  var title = document.title;
  var last = null;

  function count() {
    var el = document.getElementById("approval-count");
    var n = el ? parseInt(el.textContent, 10) : NaN;
    return isNaN(n) ? null : n;
  }

  function wanted() {
    try { return window.localStorage.getItem(KEY) === "1"; } catch (e) { return false; }
  }

  function allowed() {
    return "Notification" in window && Notification.permission === "granted" && wanted();
  }

  function notify(n) {
    var note = new Notification("Shiftlog: an approval waits", {
      body: n === 1 ? "1 tool call waits for a person." : n + " tool calls wait for a person.",
      tag: "shiftlog-approvals", // one notification, replaced, however many tabs are open
    });
    note.onclick = function () {
      window.focus();
      var link = document.getElementById("approval-count");
      window.location.href = link && link.closest("a") ? link.closest("a").href : "/approvals/";
    };
  }

  function update() {
    var n = count();
    if (n === null) return;
    document.title = (n > 0 ? "(" + n + ") " : "") + title;
    if (last !== null && n > last && allowed()) notify(n);
    last = n;
  }

  function label(button) {
    var on = wanted() && Notification.permission === "granted";
    button.setAttribute("aria-pressed", on ? "true" : "false");
    button.textContent = on ? "Notifying" : "Notify me";
    button.title = Notification.permission === "denied"
      ? "The browser blocks notifications from this site: allow them in its settings"
      : on ? "Notifications on: press to turn them off" : "Show a notification when an approval waits";
  }

  document.addEventListener("DOMContentLoaded", function () {
    var el = document.getElementById("approval-count");
    if (!el) return;
    update();
    // The badge itself is swapped by the socket; what holds it stays.
    new MutationObserver(update).observe(el.parentNode, {childList: true, subtree: true, characterData: true});
    var button = document.getElementById("notify-toggle");
    if (!button || !("Notification" in window)) return;
    button.hidden = false;
    label(button);
    button.addEventListener("click", function () {
      if (wanted() && Notification.permission === "granted") {
        try { window.localStorage.removeItem(KEY); } catch (e) { /* nothing kept */ }
        label(button);
        return;
      }
      Promise.resolve(Notification.requestPermission()).then(function (permission) {
        if (permission === "granted") {
          try { window.localStorage.setItem(KEY, "1"); } catch (e) { /* storage refused: stays off */ }
        }
        label(button);
      });
    });
  });
})();
