/* posemb's site against WCAG 2.1 AA (issue 36): the fixes that need the DOM, not a stylesheet.
   mkdocs.yml lists this after material's bundle, whose DOMContentLoaded handler mounts the
   components (wrapped tables, copy buttons) first; navigation.instant is off, so every page
   view is a fresh load. Nothing here requests anything: the site works from file://. */
(function () {
  "use strict";

  // 4.1.2 Name, role, value: the search overlay is a role="dialog" without a name. Give it the
  // one material gives its search field (translated with the theme's language).
  function nameSearchDialog() {
    const dialog = document.querySelector('.md-search[role="dialog"]');
    if (!dialog || dialog.hasAttribute("aria-label")) return;
    const input = dialog.querySelector(".md-search__input");
    dialog.setAttribute("aria-label", (input && input.getAttribute("aria-label")) || "Search");
  }

  // Landmarks: the table of contents puts each heading's sub-headings in a <nav> of their own,
  // named after the heading (the API page repeats class names), and each code block's copy
  // button sits in an unnamed <nav>. Screen readers would list dozens of navigation landmarks,
  // many with one name. Only the table of contents itself stays one; the lists inside stay lists.
  function demoteInnerNavs() {
    for (const nav of document.querySelectorAll(".md-nav--secondary nav, nav.md-code__nav")) {
      nav.removeAttribute("aria-label"); // a named element keeps its role whatever role says
      nav.setAttribute("role", "none");
    }
  }

  function overflows(el) {
    return el.scrollWidth > el.clientWidth || el.scrollHeight > el.clientHeight;
  }

  // 2.1.1 Keyboard: a table wider than the column scrolls (at 320 px, most of the API's
  // parameter tables), and a keyboard can scroll only what holds the focus. While it scrolls,
  // the wrapper is a focusable, named group (material makes code blocks focusable likewise).
  function focusWhileScrolling(wrap) {
    if (overflows(wrap)) {
      wrap.tabIndex = 0;
      wrap.setAttribute("role", "group");
      wrap.setAttribute("aria-label", "Table, scrolls sideways");
    } else {
      for (const name of ["tabindex", "role", "aria-label"]) wrap.removeAttribute(name);
    }
  }

  // A code block that scrolls and that material left out of the tab order (none today; a
  // guard, since the test fails on any unreachable scroller).
  function focusCodeWhileScrolling(code) {
    if (!code.hasAttribute("tabindex") && overflows(code)) code.tabIndex = 0;
  }

  function watchScrollers() {
    const wraps = document.querySelectorAll(".md-typeset__scrollwrap");
    const codes = document.querySelectorAll(".md-typeset pre > code");
    wraps.forEach(focusWhileScrolling);
    codes.forEach(focusCodeWhileScrolling);
    // The column's width changes with the window (a phone turned, a zoom): look again.
    const observer = new ResizeObserver((entries) => {
      for (const { target } of entries) {
        if (target.matches(".md-typeset__scrollwrap")) focusWhileScrolling(target);
        else focusCodeWhileScrolling(target);
      }
    });
    wraps.forEach((el) => observer.observe(el));
    codes.forEach((el) => observer.observe(el));
  }

  document.addEventListener("DOMContentLoaded", () => {
    nameSearchDialog();
    demoteInnerNavs();
    watchScrollers();
  });
})();
