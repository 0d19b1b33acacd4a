/* The book's own page script (served by _ext/live_study.py on every page; no network).
 *
 * 1. Sidebar buttons. pydata-sphinx-theme attaches its drawer handlers to the FIRST ".primary-toggle"
 *    and ".secondary-toggle" in the page (querySelector), which are the hidden buttons of its own
 *    header; sphinx-book-theme shows its own buttons in the article header, which then do nothing
 *    (no drawer on a phone, no collapse on a desktop). Forward their clicks to the buttons that
 *    hold the handlers.
 * 2. Explorer snapshots. In the static book no kernel answers the widgets, so the controls of an
 *    explorer (cells marked .explorer-snapshot by the extension) are disabled once the widget
 *    manager has drawn them: they show the page's inputs and do not pretend to move.
 * 3. Search snippets. Sphinx builds a result's snippet from the page's text; leave code cells
 *    (sources, outputs, glue plumbing), the per-page "run it live" line and the page's own
 *    navigation (its table of contents, header buttons, previous/next links) out of it.
 */
(function () {
  "use strict";

  function forwardSidebarToggles() {
    ["primary", "secondary"].forEach(function (side) {
      var buttons = document.querySelectorAll("." + side + "-toggle");
      var handler = buttons[0];
      for (var i = 1; i < buttons.length; i++) {
        buttons[i].addEventListener("click", function (event) {
          event.preventDefault();
          event.stopPropagation();
          handler.click();
        });
      }
    });
  }

  function freeze(output) {
    output.querySelectorAll("select, input, textarea, button").forEach(function (el) {
      if (!el.disabled) { el.disabled = true; }
      el.setAttribute("tabindex", "-1");
    });
    output.querySelectorAll(".noUi-target").forEach(function (el) {
      if (!el.hasAttribute("disabled")) { el.setAttribute("disabled", ""); }
    });
    output.querySelectorAll(".noUi-handle, [contenteditable=true]").forEach(function (el) {
      el.removeAttribute("tabindex");
      if (el.getAttribute("contenteditable") === "true") { el.setAttribute("contenteditable", "false"); }
    });
  }

  function freezeSnapshots() {
    document.querySelectorAll(".explorer-snapshot .cell_output").forEach(function (output) {
      freeze(output);
      // the widget manager draws after the page loads: freeze whatever it adds
      new MutationObserver(function () { freeze(output); })
        .observe(output, { childList: true, subtree: true });
    });
  }

  function searchSnippetsWithoutCode() {
    if (typeof Search === "undefined" || !Search.htmlToText || Search.htmlToText.prose) { return; }
    var original = Search.htmlToText;
    Search.htmlToText = function (htmlString, anchor) {
      var doc = new DOMParser().parseFromString(htmlString, "text/html");
      doc.querySelectorAll("div.cell, .open-live, .explorer-snapshot-note, .bd-sidebar-secondary, " +
                           ".bd-header-article, .prev-next-area, .bd-footer-article, .onlyprint").forEach(function (el) {
        el.remove();
      });
      return original(doc.documentElement.outerHTML, anchor);
    };
    Search.htmlToText.prose = true;
  }

  function init() {
    forwardSidebarToggles();
    freezeSnapshots();
    searchSnippetsWithoutCode();
  }

  if (document.readyState === "loading") {
    document.addEventListener("DOMContentLoaded", init);
  } else {
    init();
  }
})();
