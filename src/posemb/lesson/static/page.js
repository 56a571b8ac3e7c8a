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
    } else if (window.vegaEmbed) {
      window
        .vegaEmbed(view, fitted(fig.states[key], view.clientWidth), {
          actions: false,
          renderer: "svg",
          tooltip: true,
        })
        .catch(function (err) {
          console.error(err);
        });
    }
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
  // An exercise's button sets its figure to the state that shows the answer.
  document.querySelectorAll("button.show").forEach(function (button) {
    button.addEventListener("click", function () {
      var figId = button.getAttribute("data-fig");
      setState(figId, button.getAttribute("data-state"));
      document.getElementById(figId).scrollIntoView({ block: "start" });
    });
  });
})();
