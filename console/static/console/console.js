// The console's charts and live updates. Figures arrive as plotly JSON (json_script);
// the websocket sends a snapshot, then deltas that only set values (console/deltas.py).
// Number formats follow console/display.py.
(function () {
  "use strict";

  var PLOT_CONFIG = { responsive: true, displaylogo: false };
  var DASH = "\u2014";
  var WINDOWS = ["1", "5", "15", "60"];

  function readJSON(id) {
    var el = document.getElementById(id);
    return el ? JSON.parse(el.textContent) : null;
  }

  function percent(share) {
    return share === null || share === undefined ? DASH : (100 * share).toFixed(1) + "%";
  }

  function fixed(value, digits) {
    return value === null || value === undefined ? DASH : Number(value).toFixed(digits);
  }

  function setText(field, text, css) {
    var el = document.querySelector('[data-field="' + field + '"]');
    if (el) setCell(el, text, css);
  }

  function setCell(el, text, css) {
    if (el.textContent !== text) {
      el.textContent = text;
      el.classList.add("flash");
      setTimeout(function () { el.classList.remove("flash"); }, 700);
    }
    if (css !== undefined) {
      el.className = el.className.replace(/\bstatus-\S+/g, "").trim();
      if (css) el.classList.add(css);
    }
  }

  function plot(divId, figure) {
    var div = document.getElementById(divId);
    if (!div || !figure) return null;
    Plotly.newPlot(div, figure.data, figure.layout, PLOT_CONFIG);
    return div;
  }

  // The badge shows only on pages that subscribe: a static page is not "offline".
  function setLive(on) {
    var badge = document.getElementById("live");
    if (!badge) return;
    badge.hidden = false;
    badge.textContent = on ? "live" : "reconnecting";
    badge.className = "live " + (on ? "on" : "off");
  }

  // A websocket that reconnects after a drop (not after a refusal: 4403, 4404).
  function subscribe(path, onSnapshot, onDelta) {
    var scheme = location.protocol === "https:" ? "wss://" : "ws://";
    var socket = new WebSocket(scheme + location.host + path);
    socket.onmessage = function (event) {
      var message = JSON.parse(event.data);
      if (message.type === "snapshot") onSnapshot(message.data);
      else if (message.type === "delta") onDelta(message.data);
      setLive(true);
    };
    socket.onclose = function (event) {
      setLive(false);
      if (event.code !== 4403 && event.code !== 4404) {
        setTimeout(function () { subscribe(path, onSnapshot, onDelta); }, 2000);
      }
    };
  }

  // -- overview --------------------------------------------------------------------------
  function overviewPage() {
    var charts = {
      minute: { div: plot("chart-minute", readJSON("fig-minute")), points: {}, since: 0 },
      fine: { div: plot("chart-fine", readJSON("fig-fine")), points: {}, since: 0 }
    };
    var names = {};
    var body = document.querySelector("#tenants tbody");

    function rowOf(id) {
      return body.querySelector('tr[data-tenant="' + id + '"]');
    }

    // Django's floatformat:"-2": no decimals for a whole number, else two.
    // display.slo_text's words: the class, its targets, its share meeting both.
    function sloText(row) {
      var targets = row.ttft_ms === null || row.tbt_ms === null || row.ttft_ms === undefined ? ""
        : ": TTFT \u2264 " + Number(row.ttft_ms) + " ms, TBT \u2264 " + Number(row.tbt_ms) + " ms";
      return row.slo_class + targets + " (" + Number(row.target) + " both)";
    }

    // A row as overview.html writes it, for a tenant created after the page loaded.
    function newRow(id) {
      var tr = document.createElement("tr");
      tr.dataset.tenant = id;
      var name = document.createElement("td");
      var link = document.createElement("a");
      link.href = body.dataset.tenantUrl.replace(/0\/$/, id + "/");
      name.appendChild(link);
      tr.appendChild(name);
      tr.appendChild(document.createElement("td"));
      var fields = [];
      WINDOWS.forEach(function (w) { fields.push("w" + w + "-ttft", "w" + w + "-tbt", "w" + w + "-joint"); });
      fields.concat(["rps", "tps", "errors"]).forEach(function (field) {
        var td = document.createElement("td");
        td.dataset.field = field;
        td.className = "num";
        tr.appendChild(td);
      });
      body.appendChild(tr);
      return tr;
    }

    // Updates (or adds) the tenant's row; true when its chart lines need redrawing:
    // a new tenant or a new name.
    function updateRow(id, row) {
      var relabel = names[id] !== row.name;
      names[id] = row.name;
      var tr = rowOf(id) || newRow(id);
      tr.className = "row-" + row.status;
      var name = tr.cells[0];
      name.querySelector("a").textContent = row.name;
      var tag = name.querySelector(".tag");
      if (!row.active && !tag) {
        tag = document.createElement("span");
        tag.className = "tag";
        tag.textContent = "inactive";
        name.append(" ", tag);
      } else if (row.active && tag) {
        tag.previousSibling.remove();  // the space before it
        tag.remove();
      }
      tr.cells[1].textContent = sloText(row);
      WINDOWS.forEach(function (w) {
        var a = row.windows[w];
        setCell(tr.querySelector('[data-field="w' + w + '-ttft"]'), percent(a.ttft));
        setCell(tr.querySelector('[data-field="w' + w + '-tbt"]'), percent(a.tbt));
        setCell(tr.querySelector('[data-field="w' + w + '-joint"]'), percent(a.joint), "status-" + a.status);
      });
      setCell(tr.querySelector('[data-field="rps"]'), fixed(row.requests_per_s, 2));
      setCell(tr.querySelector('[data-field="tps"]'), fixed(row.tokens_per_s, 1));
      setCell(tr.querySelector('[data-field="errors"]'), String(row.errors));
      return relabel;
    }

    function redraw(chart, at) {
      if (!chart.div) return;
      var data = Object.keys(chart.points).map(function (id) {
        var points = chart.points[id];
        var times = Object.keys(points).map(Number).filter(function (t) { return t >= chart.since; });
        times.sort(function (a, b) { return a - b; });
        // An empty bucket breaks the line (figures.with_gaps does the same server-side).
        var step = (chart.div.layout.meta || {}).step_s;
        var x = [], y = [];
        times.forEach(function (t, i) {
          x.push(t * 1000); y.push(points[t]);
          if (step && i + 1 < times.length && times[i + 1] - t > step) {
            x.push((t + step) * 1000); y.push(null);
          }
        });
        return {
          type: "scatter", mode: "lines+markers", name: names[id] || id, meta: id,
          x: x, y: y, connectgaps: false
        };
      });
      var layout = chart.div.layout;
      if (at !== undefined) {
        layout.xaxis = Object.assign({}, layout.xaxis, { range: [chart.since * 1000, at * 1000] });
      }
      Plotly.react(chart.div, data, layout, PLOT_CONFIG);
    }

    function merge(chart, series, since) {
      if (since !== undefined) chart.since = since;
      Object.keys(series || {}).forEach(function (id) {
        var points = chart.points[id] || (chart.points[id] = {});
        Object.keys(series[id]).forEach(function (t) { points[t] = series[id][t]; });
      });
      // Drop points that left the window so the arrays do not grow forever.
      Object.keys(chart.points).forEach(function (id) {
        Object.keys(chart.points[id]).forEach(function (t) {
          if (Number(t) < chart.since) delete chart.points[id][t];
        });
      });
    }

    function forget(id) {
      delete charts.minute.points[id];
      delete charts.fine.points[id];
      delete names[id];
      var tr = rowOf(id);
      if (tr) tr.remove();
    }

    // Rows in the server's order; rows it no longer has go (after a reconnect the
    // snapshot, not a delta, tells of tenants deleted meanwhile).
    function arrange(order) {
      var keep = {};
      order.forEach(function (id) { keep[id] = true; });
      Array.prototype.forEach.call(body.querySelectorAll("tr[data-tenant]"), function (tr) {
        if (!keep[tr.dataset.tenant]) forget(tr.dataset.tenant);
      });
      order.forEach(function (id) {
        var tr = rowOf(id);
        if (tr) body.appendChild(tr);
      });
      document.getElementById("no-tenants").hidden = order.length > 0;
    }

    function apply(delta, full) {
      if (full) { charts.minute.points = {}; charts.fine.points = {}; }
      var lines = false;  // tenants came, went or were renamed: redraw both charts
      Object.keys(delta.tenants || {}).forEach(function (id) {
        if (updateRow(id, delta.tenants[id])) lines = true;
      });
      (delta.removed || []).forEach(forget);
      if (delta.order) arrange(delta.order);
      lines = lines || Boolean(delta.removed || delta.order);
      if (lines || delta.minute || delta.minute_since !== undefined) {
        merge(charts.minute, delta.minute, delta.minute_since);
        redraw(charts.minute, delta.at);
      }
      if (lines || delta.fine || delta.fine_since !== undefined) {
        merge(charts.fine, delta.fine, delta.fine_since);
        redraw(charts.fine, delta.at);
      }
    }

    subscribe(document.body.dataset.ws, function (snapshot) { apply(snapshot, true); }, apply);
  }

  // -- node ------------------------------------------------------------------------------
  function nodePage() {
    var memory = plot("chart-memory", readJSON("fig-memory"));
    var requests = plot("chart-requests", readJSON("fig-requests"));
    var steps = plot("chart-steps", readJSON("fig-steps"));
    var lastStep = 0;
    var MAX_STEPS = 256;
    (readJSON("fig-steps").data[0].x || []).forEach(function (i) { lastStep = Math.max(lastStep, i); });

    function modelsTable(models) {
      var body = document.getElementById("models-body");
      if (!body) return;
      body.replaceChildren();
      models.forEach(function (m) {
        var tr = document.createElement("tr");
        [
          [m.name, ""], [m.sharing, ""], [m.priority, "num"], [m.active ? "yes" : "no", ""],
          [m.running, "num"], [m.waiting, "num"], [m.rotary, "num"],
          [m.kv_blocks_used + " / " + m.kv_blocks_total, "num"], [m.remapped_layers, "num"],
          [m.host_swap_blocks_used, "num"], [m.prefix_hits, "num"]
        ].forEach(function (cell) {
          var td = document.createElement("td");
          td.textContent = String(cell[0]);
          if (cell[1]) td.className = cell[1];
          tr.appendChild(td);
        });
        body.appendChild(tr);
      });
    }

    function apply(delta) {
      if (delta.status !== undefined) setText("status", delta.status, "status-" + delta.status);
      if (delta.rotation !== undefined) {
        setText("rotation", delta.rotation, delta.rotation === "in rotation" ? "" : "status-miss");
      }
      if (delta.last_seen !== undefined) setText("last_seen", delta.last_seen || "never");
      if (delta.turn_holder !== undefined) setText("turn_holder", delta.turn_holder || DASH);
      if (delta.turn_switches !== undefined) setText("turn_switches", String(delta.turn_switches));
      if (delta.error !== undefined) setText("error", delta.error);
      if (delta.has_state) {
        var notice = document.getElementById("no-state");
        if (notice) notice.remove();
      }
      if (delta.rates !== undefined) {
        var r = delta.rates || {};
        setText("rotations_per_s", fixed(r.rotations_per_s, 2));
        setText("d2h_gb_per_s", fixed(r.d2h_gb_per_s, 3));
        setText("h2d_gb_per_s", fixed(r.h2d_gb_per_s, 3));
        setText("steps_per_s", fixed(r.steps_per_s, 1));
      }
      if (delta.models) modelsTable(delta.models);
      if (delta.memory_figure && memory) {
        Plotly.react(memory, delta.memory_figure.data, delta.memory_figure.layout, PLOT_CONFIG);
      }
      if (delta.requests_figure && requests) {
        Plotly.react(requests, delta.requests_figure.data, delta.requests_figure.layout, PLOT_CONFIG);
      }
      if (delta.steps_reset && steps) {
        lastStep = 0;
        Plotly.react(steps, [Object.assign({}, steps.data[0], { x: [], y: [] })], steps.layout, PLOT_CONFIG);
        addSteps(delta.steps_reset);
      } else if (delta.steps) {
        addSteps(delta.steps);
      }
    }

    function addSteps(points) {
      var fresh = points.filter(function (p) { return p[0] > lastStep; });
      if (!fresh.length || !steps) return;
      lastStep = fresh[fresh.length - 1][0];
      Plotly.extendTraces(steps, {
        x: [fresh.map(function (p) { return p[0]; })],
        y: [fresh.map(function (p) { return p[1]; })]
      }, [0], MAX_STEPS);
    }

    subscribe(document.body.dataset.ws, apply, apply);
  }

  // -- tenant ----------------------------------------------------------------------------
  function tenantPage() {
    plot("chart-ttft", readJSON("fig-ttft"));
    plot("chart-tpot", readJSON("fig-tpot"));
  }

  var page = document.body.dataset.page;
  if (page === "overview") overviewPage();
  else if (page === "node") nodePage();
  else if (page === "tenant") tenantPage();
})();
