// Shiftlog: the colour theme. Loaded in <head> without defer, so a chosen theme is on <html>
// before the first paint (no flash of the other one). Without a choice the system's preference
// rules (the stylesheet's light-dark() colours follow color-scheme).
(function () {
  "use strict";
  var KEY = "shiftlog-theme";
  var root = document.documentElement;

  function stored() {
    try {
      var v = window.localStorage.getItem(KEY);
      return v === "light" || v === "dark" ? v : "";
    } catch (e) {
      return ""; // storage refused (privacy mode): follow the system
    }
  }

  function apply(theme) {
    if (theme) root.setAttribute("data-theme", theme);
    else root.removeAttribute("data-theme");
  }

  var current = stored();
  apply(current);

  // The header's button goes system → the other scheme → this one → system, so its first press
  // always changes what you see.
  function order() {
    var dark = window.matchMedia && window.matchMedia("(prefers-color-scheme: dark)").matches;
    return dark ? ["", "light", "dark"] : ["", "dark", "light"];
  }

  function label(button) {
    button.textContent = "Theme: " + (current || "system");
  }

  document.addEventListener("DOMContentLoaded", function () {
    var button = document.getElementById("theme-toggle");
    if (!button) return;
    button.hidden = false;
    label(button);
    button.addEventListener("click", function () {
      var themes = order();
      current = themes[(themes.indexOf(current) + 1) % themes.length];
      try {
        if (current) window.localStorage.setItem(KEY, current);
        else window.localStorage.removeItem(KEY);
      } catch (e) { /* not kept: this page changes all the same */ }
      apply(current);
      label(button);
    });
  });
})();
