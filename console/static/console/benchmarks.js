// The Benchmarks page: draws every chart whose figure is in the page (json_script).
(function () {
  "use strict";
  var CONFIG = { responsive: true, displaylogo: false };
  document.querySelectorAll("[data-figure]").forEach(function (div) {
    var source = document.getElementById(div.getAttribute("data-figure"));
    if (!source) return;
    var figure = JSON.parse(source.textContent);
    Plotly.newPlot(div, figure.data, figure.layout, CONFIG);
  });
})();
