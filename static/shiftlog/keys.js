// Shiftlog: the approvals inbox from the keyboard. j/k move between cards, a approves, d opens
// the deny reason, e the edit box, ? lists the keys. Every decision goes through the card's own
// form (a POST with its CSRF token), so the server decides who may do what, as for a click.
(function () {
  "use strict";
  var KEYS = [
    ["j", "next approval"],
    ["k", "previous approval"],
    ["a", "approve it"],
    ["d", "deny it: type the reason, then Enter"],
    ["e", "edit its input before approving"],
    ["Esc", "leave a field, close this help"],
    ["?", "show these keys"],
  ];
  var current = null; // the id of the card the keys act on

  function list() { return document.getElementById("approval-list"); }
  function cards() { return Array.prototype.slice.call(list().querySelectorAll(".approval")); }

  function typing(el) {
    return el && (el.isContentEditable || /^(INPUT|TEXTAREA|SELECT)$/.test(el.tagName));
  }

  function select(card) {
    cards().forEach(function (c) { c.removeAttribute("aria-current"); });
    if (!card) { current = null; return; }
    current = card.id;
    card.setAttribute("aria-current", "true");
    card.tabIndex = -1;
    card.focus();
  }

  function selected() { return current && document.getElementById(current); }

  function move(step) {
    var all = cards();
    if (!all.length) return;
    var at = all.indexOf(selected());
    var next = at < 0 ? (step > 0 ? 0 : all.length - 1) : Math.min(Math.max(at + step, 0), all.length - 1);
    select(all[next]);
    all[next].scrollIntoView({block: "nearest"});
  }

  function press(card, selector) {
    var button = card && card.querySelector("form.decide " + selector);
    if (button) button.click(); // htmx sends the form with this button's name and value
  }

  function deny(card) {
    var box = card && card.querySelector("form.decide input[name=reason]");
    if (!box) return;
    card.classList.add("denying");
    box.placeholder = "Why not? (the agent reads it) — Enter denies, Esc cancels";
    box.focus();
  }

  function edit(card) {
    var details = card && card.querySelector("details.edit");
    if (!details) return;
    details.open = true;
    details.querySelector("textarea").focus();
  }

  var help = null;
  function showHelp() {
    if (!help) {
      help = document.createElement("dialog");
      help.className = "keys-help";
      help.setAttribute("aria-labelledby", "keys-help-title");
      var title = document.createElement("h2");
      title.id = "keys-help-title";
      title.textContent = "Keyboard";
      var dl = document.createElement("dl");
      KEYS.forEach(function (k) {
        var dt = document.createElement("dt"), kbd = document.createElement("kbd"), dd = document.createElement("dd");
        kbd.textContent = k[0];
        dt.appendChild(kbd);
        dd.textContent = k[1];
        dl.appendChild(dt);
        dl.appendChild(dd);
      });
      var close = document.createElement("button");
      close.type = "button";
      close.textContent = "Close";
      close.addEventListener("click", function () { help.close(); });
      help.appendChild(title);
      help.appendChild(dl);
      help.appendChild(close);
      document.body.appendChild(help);
    }
    if (!help.open) help.showModal(); // Esc closes a modal dialog
  }

  document.addEventListener("keydown", function (e) {
    if (!list() || e.ctrlKey || e.metaKey || e.altKey) return;
    var card = selected();
    if (typing(e.target)) {
      var inCard = e.target.closest(".approval");
      if (!inCard) return;
      if (e.key === "Escape") {
        inCard.classList.remove("denying");
        select(inCard);
        e.preventDefault();
      } else if (e.key === "Enter" && inCard.classList.contains("denying") && e.target.name === "reason") {
        // Enter in a text box sends the form with its first button, Approve: not while denying.
        e.preventDefault();
        press(inCard, "button[value=deny]");
      }
      return;
    }
    if (help && help.open) return;
    var acts = {
      j: function () { move(1); },
      k: function () { move(-1); },
      a: function () { press(card, "button[value=approve]"); },
      d: function () { deny(card); },
      e: function () { edit(card); },
      "?": showHelp,
    };
    if (!acts[e.key]) return;
    e.preventDefault();
    acts[e.key]();
  });

  // A decided card is swapped for its new self (by the form's answer, then by the live push):
  // the keys stay on it.
  function keep() {
    var card = selected();
    if (!card || card.hasAttribute("aria-current")) return;
    if (typing(document.activeElement) && !card.contains(document.activeElement)) return;
    select(card);
  }

  document.addEventListener("DOMContentLoaded", function () {
    if (!list()) return;
    // The whole list is replaced after a reconnect: watch what holds it.
    new MutationObserver(keep).observe(list().parentNode, {childList: true, subtree: true});
    var head = document.querySelector(".page-head");
    if (!head) return;
    var hint = document.createElement("span");
    hint.className = "muted small keys-hint";
    hint.textContent = "Keyboard: j/k to move, a approve, d deny, e edit, ? for help";
    head.appendChild(hint);
  });
})();
