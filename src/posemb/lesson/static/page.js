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
    } else if (window.vegaEmbed) {
      window
        .vegaEmbed(view, fig.states[key], { actions: false, renderer: "svg", tooltip: true })
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
  });
})();
