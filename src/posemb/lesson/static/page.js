// posemb lesson page: renders the maths, and swaps each figure's state when a control moves.
// Every state's picture and readout was computed by posemb when the page was built; this
// script only chooses among them, so what a reader sees for a state is what posemb computed.
(function () {
  "use strict";
  var data = JSON.parse(document.getElementById("posemb-figures").textContent);

  function renderMaths() {
    if (!window.katex) return;
    document.querySelectorAll(".math").forEach(function (el) {
      window.katex.render(el.getAttribute("data-tex"), el, {
        displayMode: true,
        throwOnError: false,
        output: "htmlAndMathml",
      });
    });
  }

  function controlIndex(figId, control) {
    if (control.kind === "slider") {
      return parseInt(document.getElementById(control.id).value, 10);
    }
    var checked = document.querySelector('input[name="' + control.id + '"]:checked');
    return checked ? parseInt(checked.value, 10) : control["default"];
  }

  function stateKey(fig) {
    return fig.controls
      .map(function (c) {
        return c.values[controlIndex(fig.id, c)];
      })
      .join(POSEMB_STATE_SEPARATOR);
  }

  // A chart wider than its card is refitted to the card, so its text keeps its size: a single
  // or layered view fits its width, side-by-side views stack.
  function fitted(spec, avail) {
    if (!avail || typeof spec !== "object") return spec;
    var out = Object.assign({}, spec);
    if (typeof out.width === "number" && !out.facet && !out.hconcat && !out.vconcat) {
      if (out.width + 140 > avail) {
        out.width = Math.max(160, avail - 10);
        out.autosize = { type: "fit-x", contains: "padding" };
      }
    } else if (out.hconcat) {
      var need = out.hconcat.reduce(function (sum, part) {
        return sum + (typeof part.width === "number" ? part.width : 200) + 80;
      }, 0);
      if (need > avail) {
        out.vconcat = out.hconcat;
        delete out.hconcat;
      }
    } else if (out.facet && out.spec && typeof out.spec.width === "number") {
      var cell = out.spec.width + 60;
      if (out.facet.column && !out.facet.row && 2 * cell > avail) {
        // Side-by-side panels wrap into as many columns as fit (one on a phone).
        out.facet = Object.assign({}, out.facet.column);
        out.columns = Math.max(1, Math.floor(avail / cell));
      } else if (out.spec.width + 140 > avail) {
        out.spec = Object.assign({}, out.spec, { width: Math.max(160, avail - 140) });
      }
    }
    return out;
  }

  // Hand-drawn diagrams scale down with the card only while their 12 px text stays >= 10 px.
  function keepTextReadable(view) {
    view.querySelectorAll(":scope > svg[viewBox]").forEach(function (svg) {
      // Text is 12 viewBox units or more: at 10/12 of the viewBox width it is 10 px.
      var w = parseFloat(svg.getAttribute("viewBox").split(/\s+/)[2]);
      if (w) svg.style.minWidth = Math.round((w * 10) / 12) + "px";
    });
  }

  function setState(figId, key) {
    var fig = data[figId];
    var values = fig.controls.length ? key.split(POSEMB_STATE_SEPARATOR) : [];
    fig.controls.forEach(function (c, i) {
      var index = c.values.indexOf(values[i]);
      if (index < 0) return;
      if (c.kind === "slider") {
        document.getElementById(c.id).value = String(index);
      } else {
        document.querySelector('input[name="' + c.id + '"][value="' + index + '"]').checked = true;
      }
    });
    show(figId);
  }

  function show(figId) {
    var fig = data[figId];
    var key = stateKey(fig);
    var view = document.getElementById(figId + "-view");
    fig.controls.forEach(function (c) {
      if (c.kind !== "slider") return;
      var el = document.getElementById(c.id);
      var text = c.values[controlIndex(figId, c)];
      el.setAttribute("aria-valuetext", text);
      document.getElementById(c.id + "-value").textContent = text;
    });
    document.getElementById(figId + "-readout").textContent = fig.readouts[key];
    view.setAttribute("data-state", key);
    if (fig.kind === "svg") {
      view.innerHTML = fig.states[key];
      keepTextReadable(view);
      markScrollable(view);
    } else if (window.vegaEmbed) {
      window
        .vegaEmbed(view, fitted(fig.states[key], view.clientWidth), {
          actions: false,
          renderer: "svg",
          tooltip: true,
        })
        .then(function () {
          // The chart is named by its spec's description; its marks, ticks and facet headers
          // would be read out one by one after it (config.aria misses the headers).
          var svg = view.querySelector("svg");
          if (svg) svg.setAttribute("aria-hidden", "true");
          markScrollable(view);
        })
        .catch(function (err) {
          console.error(err);
        });
      fillValues(figId);
    }
  }

  // A part wider than its card scrolls sideways inside the card (never the page), and a
  // values table taller than 24rem scrolls down; a keyboard reaches either: it takes focus
  // (arrow keys then scroll it) only while it overflows, so a part that fits adds no tab
  // stop. An equation gets a name to be announced by.
  function markScrollable(el) {
    var tall = getComputedStyle(el).overflowY === "auto" && el.scrollHeight > el.clientHeight + 1;
    if (el.scrollWidth > el.clientWidth + 1 || tall) {
      el.setAttribute("tabindex", "0");
      if (el.classList.contains("math")) {
        el.setAttribute("role", "group");
        el.setAttribute("aria-label", "Equation, scrolls sideways");
      }
    } else if (el.getAttribute("tabindex") === "0") {
      el.removeAttribute("tabindex");
    }
  }

  function markAllScrollable() {
    document.querySelectorAll(".view, .math, .values-wrap").forEach(markScrollable);
  }

  // The values a sighted reader gets by hovering a chart, as a table: the fields of its
  // tooltips, over the rows of the state shown. Built when its <details> opens, and again
  // when the state changes while it is open.
  var MAX_ROWS = 400;

  // Per data source of the spec (a layer's own, or the one it inherits), the fields its
  // tooltips show: [{rows, fields: [{field, title}]}].
  function tooltipTables(node, rows, out) {
    if (!node || typeof node !== "object") return out;
    rows = (node.data && node.data.values) || rows;
    var tips = [].concat((node.encoding && node.encoding.tooltip) || []);
    if (tips.length && rows) {
      var entry = out.filter(function (e) { return e.rows === rows; })[0];
      if (!entry) out.push((entry = { rows: rows, fields: [] }));
      tips.forEach(function (t) {
        var field = typeof t === "string" ? t.split(":")[0] : t.field;
        if (!field || entry.fields.some(function (f) { return f.field === field; })) return;
        entry.fields.push({ field: field, title: (t && t.title) || field });
      });
    }
    ["layer", "hconcat", "vconcat", "concat"].forEach(function (k) {
      (node[k] || []).forEach(function (part) { tooltipTables(part, rows, out); });
    });
    if (node.spec) tooltipTables(node.spec, rows, out);
    return out;
  }

  // The table of the chart's main data: the source with the most rows (the others are a
  // reference line or two, which the readout and the caption state).
  function mainTable(spec) {
    var best = { rows: [], fields: [] };
    tooltipTables(spec, null, []).forEach(function (e) {
      var rows = e.rows.filter(function (r) {
        return e.fields.some(function (f) { return r[f.field] !== undefined; });
      });
      if (rows.length > best.rows.length) best = { rows: rows, fields: e.fields };
    });
    return best;
  }

  function shown(v) {
    if (typeof v === "number" && !Number.isInteger(v)) return String(Number(v.toPrecision(4)));
    return v === undefined || v === null ? "" : String(v);
  }

  function fillValues(figId) {
    var box = document.querySelector('details.values[data-fig="' + figId + '"]');
    if (!box || !box.open) return;
    var main = mainTable(data[figId].states[stateKey(data[figId])]);
    var fields = main.fields, rows = main.rows;
    var table = document.createElement("table");
    var caption = table.createCaption();
    caption.textContent =
      box.getAttribute("data-title") + ": " +
      (rows.length > MAX_ROWS ? "the first " + MAX_ROWS + " of " : "") + rows.length + " rows";
    var head = table.createTHead().insertRow();
    fields.forEach(function (f) {
      var th = document.createElement("th");
      th.scope = "col";
      th.textContent = f.title;
      head.appendChild(th);
    });
    var body = table.createTBody();
    rows.slice(0, MAX_ROWS).forEach(function (r) {
      var tr = body.insertRow();
      fields.forEach(function (f) { tr.insertCell().textContent = shown(r[f.field]); });
    });
    var wrap = box.querySelector(".values-wrap");
    wrap.replaceChildren(table);
    markScrollable(wrap);
  }

  renderMaths();
  Object.keys(data).forEach(function (figId) {
    var fig = data[figId];
    fig.id = figId;
    document.querySelectorAll('[data-fig="' + figId + '"]').forEach(function (el) {
      el.addEventListener("input", function () {
        show(figId);
      });
      el.addEventListener("change", function () {
        show(figId);
      });
    });
    // Vega views replace the static first state so that hovering shows values.
    if (fig.kind === "vega") show(figId);
    else keepTextReadable(document.getElementById(figId + "-view"));
  });
  // An exercise's button sets its figure to the state that shows the answer, and takes the
  // reader there: focus moves to the figure (named by its title), so the next Tab continues
  // from the figure just shown, not from the button far below it.
  document.querySelectorAll("button.show").forEach(function (button) {
    button.addEventListener("click", function () {
      var figId = button.getAttribute("data-fig");
      setState(figId, button.getAttribute("data-state"));
      var fig = document.getElementById(figId);
      fig.scrollIntoView({ block: "start" });
      fig.focus({ preventScroll: true });
    });
  });
  document.querySelectorAll("details.values").forEach(function (box) {
    box.addEventListener("toggle", function () {
      fillValues(box.getAttribute("data-fig"));
    });
  });
  document.querySelectorAll("details").forEach(function (box) {
    box.addEventListener("toggle", markAllScrollable);
  });
  var resizing = null;
  window.addEventListener("resize", function () {
    clearTimeout(resizing);
    resizing = setTimeout(markAllScrollable, 150);
  });
  // Print the whole lesson: the answers and checks folded on screen are opened for paper and
  // folded again afterwards (the values tables stay as they are: pages of numbers).
  var openedForPrint = [];
  window.addEventListener("beforeprint", function () {
    openedForPrint = [].slice.call(document.querySelectorAll("details:not([open]):not(.values)"));
    openedForPrint.forEach(function (d) { d.open = true; });
  });
  window.addEventListener("afterprint", function () {
    openedForPrint.forEach(function (d) { d.open = false; });
    openedForPrint = [];
  });
  markAllScrollable();
  // KaTeX's fonts arrive after the first layout and widen the equations they set.
  if (document.fonts) document.fonts.ready.then(markAllScrollable);
  window.addEventListener("load", markAllScrollable);
})();
