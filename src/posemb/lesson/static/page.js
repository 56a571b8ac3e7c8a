// posemb lesson page: renders the maths, and swaps each figure's state when a control moves.
// Every state's picture and readout was computed by posemb when the page was built; this
// script only chooses among them, so what a reader sees for a state is what posemb computed.
(function () {
  "use strict";
  var data = JSON.parse(document.getElementById("posemb-figures").textContent);

  function renderMaths() {
    document.querySelectorAll(".math").forEach(function (el, i) {
      el.setAttribute("data-n", String(i + 1));
    });
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

  // What a narrowed chart changes so that none of its text falls outside it: legends go
  // under the plot, one entry a line; long axis titles break into lines; and the right edge
  // keeps room for a label written beside the last point.
  function narrowed(out, avail) {
    var config = Object.assign({}, out.config);
    config.legend = Object.assign({}, config.legend, {
      orient: "bottom",
      direction: "vertical",
      labelLimit: Math.max(120, avail - 140),
    });
    out.config = config;
    out.padding = { left: 5, top: 5, bottom: 5, right: 40 };
    wrapTitles(out, Math.max(120, avail - 90));
    return out;
  }

  // Axis titles wider than ``width`` px (at about 7 px a character) as lines of words.
  function wrapTitles(node, width) {
    if (!node || typeof node !== "object") return;
    var per = Math.floor(width / 7);
    Object.keys(node).forEach(function (k) {
      var v = node[k];
      if (k === "data" || k === "datasets") return;
      if ((k === "x" || k === "y") && v && typeof v.title === "string" && v.title.length > per) {
        var lines = [""];
        v.title.split(" ").forEach(function (word) {
          var last = lines[lines.length - 1];
          if (last && (last + " " + word).length > per) lines.push(word);
          else lines[lines.length - 1] = last ? last + " " + word : word;
        });
        node[k] = Object.assign({}, v, { title: lines });
      } else if (v && typeof v === "object") {
        node[k] = Array.isArray(v) ? v.slice() : Object.assign({}, v);
        wrapTitles(node[k], width);
      }
    });
  }

  // A chart wider than its card is refitted to the card, so its text keeps its size: a single
  // or layered view fits its width, side-by-side views stack.
  function fitted(spec, avail) {
    if (!avail || typeof spec !== "object") return spec;
    var out = fittedWidth(Object.assign({}, spec), avail);
    return out.width !== spec.width || out.hconcat !== spec.hconcat || out.facet !== spec.facet ||
      out.spec !== spec.spec ? narrowed(out, avail) : out;
  }

  function fittedWidth(out, avail) {
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

  // A diagram is one image to a screen reader, named like a chart: its alt text and what its
  // state shows; the drawing's own labels would be read after it, one by one.
  function describe(view, fig, key) {
    var svg = view.querySelector(":scope > svg");
    if (svg) svg.setAttribute("aria-hidden", "true");
    view.setAttribute("aria-label", fig.alt + " Shown: " + fig.readouts[key]);
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
      describe(view, fig, key);
      markScrollable(view);
    } else if (window.vegaEmbed) {
      view.setAttribute("data-fit-width", String(view.clientWidth));
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
  // stop. An equation that scrolls is named, to be announced by when it takes focus.
  function markScrollable(el) {
    var tall = getComputedStyle(el).overflowY === "auto" && el.scrollHeight > el.clientHeight + 1;
    var math = el.classList.contains("math");
    if (el.scrollWidth > el.clientWidth + 1 || tall) {
      el.setAttribute("tabindex", "0");
      if (math) {
        el.setAttribute("role", "group");
        el.setAttribute("aria-label", "Equation " + el.getAttribute("data-n") + ", scrolls sideways");
      }
    } else if (el.getAttribute("tabindex") === "0") {
      el.removeAttribute("tabindex");
      if (math) {
        el.removeAttribute("role");
        el.removeAttribute("aria-label");
      }
    }
  }

  function markAllScrollable() {
    document.querySelectorAll(".view, .math, .values-wrap").forEach(markScrollable);
  }

  // A chart fitted to its card when drawn is drawn again when the card's width changes (a
  // zoom, a phone turned): scaled instead, its text would shrink under 10 px.
  function refitCharts() {
    Object.keys(data).forEach(function (figId) {
      var view = document.getElementById(figId + "-view");
      var drawn = parseFloat(view.getAttribute("data-fit-width"));
      if (data[figId].kind === "vega" && Math.abs(view.clientWidth - drawn) > 8) show(figId);
    });
    markAllScrollable();
  }

  // The values a sighted reader gets by hovering a chart, as a table: the fields of its
  // tooltips, led by what tells its rows apart that no tooltip shows (a facet's panel, the
  // field a layer is filtered on), over the rows of the state shown. Built when its <details>
  // opens, and again when the state changes while it is open.
  var MAX_ROWS = 5000;

  function fieldOf(def) {
    return typeof def === "string" ? def.split(":")[0] : def && def.field;
  }

  function addField(list, field, title, format) {
    if (!field || list.some(function (f) { return f.field === field; })) return;
    list.push({ field: field, title: title || field, format: format });
  }

  // The fields a view's rows are split by: its facet's and the ones its filters read.
  function splitFields(node, lead) {
    lead = lead.slice();
    var facet = node.facet || {};
    var enc = node.encoding || {};
    [facet, facet.row, facet.column, enc.row, enc.column, enc.facet].forEach(function (f) {
      if (f) addField(lead, fieldOf(f), f.title);
    });
    (node.transform || []).forEach(function (t) {
      var found = typeof t.filter === "string" ? t.filter.match(/datum\.(\w+)/g) : null;
      (found || []).forEach(function (m) { addField(lead, m.slice(6)); });
    });
    return lead;
  }

  // Per data source of the spec (a layer's own, or the one it inherits), the fields its
  // tooltips show and those that split it: [{rows, lead, fields}].
  function tooltipTables(node, rows, lead, out) {
    if (!node || typeof node !== "object") return out;
    rows = (node.data && node.data.values) || rows;
    lead = splitFields(node, lead);
    var tips = [].concat((node.encoding && node.encoding.tooltip) || []);
    if (tips.length && rows) {
      var entry = out.filter(function (e) { return e.rows === rows; })[0];
      if (!entry) out.push((entry = { rows: rows, lead: [], fields: [] }));
      lead.forEach(function (f) { addField(entry.lead, f.field, f.title); });
      tips.forEach(function (t) { addField(entry.fields, fieldOf(t), t && t.title, t && t.format); });
    }
    ["layer", "hconcat", "vconcat", "concat"].forEach(function (k) {
      (node[k] || []).forEach(function (part) { tooltipTables(part, rows, lead, out); });
    });
    if (node.spec) tooltipTables(node.spec, rows, lead, out);
    return out;
  }

  // The table of the chart's main data: the source with the most rows (the others are a
  // reference line or two, which the readout and the caption state).
  function mainTable(spec) {
    var best = { rows: [], fields: [] };
    tooltipTables(spec, null, [], []).forEach(function (e) {
      var fields = e.lead.filter(function (f) {
        return !e.fields.some(function (g) { return g.field === f.field; });
      }).concat(e.fields);
      var rows = e.rows.filter(function (r) {
        return e.fields.some(function (f) { return r[f.field] !== undefined; });
      });
      if (rows.length > best.rows.length) best = { rows: rows, fields: fields };
    });
    return best;
  }

  // A value as its tooltip shows it (the tooltip's d3 format, through Vega's own locale).
  function shown(v, format) {
    if (v === undefined || v === null) return "";
    if (typeof v === "number" && format && window.vega && window.vega.locale) {
      try {
        return window.vega.locale().format(format)(v);
      } catch (err) {
        /* an unknown specifier: shown as below */
      }
    }
    if (typeof v === "number" && !Number.isInteger(v)) return String(Number(v.toPrecision(4)));
    return String(v);
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
      fields.forEach(function (f) { tr.insertCell().textContent = shown(r[f.field], f.format); });
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
    else if (fig.kind === "svg") {
      var view = document.getElementById(figId + "-view");
      keepTextReadable(view);
      describe(view, fig, stateKey(fig));
    }
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
    resizing = setTimeout(refitCharts, 150);
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
