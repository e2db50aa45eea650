"""The style and the script of routes.html, inlined into the page (nothing is fetched). The
script reads the JSON the page embeds (`page.script_json`): the result's `to_dict()` and the
texts as shown; it shows an edge's tooltip on hover and a node's panel on a click or Enter."""

from __future__ import annotations

from resstream.reporting.attribute.page import PAGE_STYLE

__all__ = ["ROUTES_SCRIPT", "ROUTES_STYLE"]

#: The page's style: the reports' common one (`PAGE_STYLE`), then the graph's, the node
#: panel's and the tooltip's.
ROUTES_STYLE = PAGE_STYLE + (
    "body{max-width:1640px}#graph{display:block;max-width:100%;height:auto}.layout{display:flex;gap:1em;align-items:flex-start}"
    ".graph{flex:1 1 auto;overflow:auto;border:1px solid #eee}"
    "#panel{flex:0 0 330px;position:sticky;top:.5em;max-height:95vh;overflow:auto;font-size:90%;"
    "border:1px solid #ddd;border-radius:4px;padding:.6em .8em;background:#fcfcfc}"
    "#panel h3{margin:.1em 0 .3em;font-size:1.05em}#panel h4{margin:.8em 0 .2em;font-size:.95em}"
    "#panel table{width:100%}#panel td{white-space:pre-wrap}.bar{background:#9ecae1;height:.7em}"
    "svg text{font-family:sans-serif;font-size:11px;fill:#333}svg .row{text-anchor:end}"
    "svg .token{text-anchor:end;font-family:monospace}svg .later{fill:#aaa}"
    "svg .predicted{font-weight:bold;fill:#d62728;font-size:13px}svg .band{fill:#f2f2f2}"
    "svg .column{stroke:#e6e6e6;stroke-width:1}.edge path{fill:none}.edge .hit{stroke:transparent}"
    ".edge .line{stroke-linecap:round;pointer-events:none}"
    ".edge:hover .line{stroke-opacity:1;filter:brightness(.75)}"
    ".edge.dim .line{stroke-opacity:.25}.node{fill:#333;cursor:pointer}"
    ".node.prediction{fill:#ffd84d;stroke:#d62728;stroke-width:2.5}"
    ".node:focus{outline:none}.node:focus,.node.selected{stroke:#08f;stroke-width:3}"
    "#tip{position:fixed;pointer-events:none;background:#fff;border:1px solid #999;border-radius:3px;"
    "padding:.3em .5em;font-size:85%;box-shadow:0 1px 4px rgba(0,0,0,.2);white-space:pre;z-index:2}"
    ".legend span.swatch{display:inline-block;width:2.2em;height:.5em;vertical-align:middle;margin:0 .3em}"
)


#: The page's script (plain JavaScript, no library): tooltips on the edges, the node panel.
ROUTES_SCRIPT = r"""
(function () {
  "use strict";
  var payload = JSON.parse(document.getElementById("routes-data").textContent);
  var data = payload.result, shown = payload.shown;
  var tip = document.getElementById("tip"), panel = document.getElementById("panel");
  var edges = Array.prototype.slice.call(document.querySelectorAll("#graph .edge"));
  var nodes = Array.prototype.slice.call(document.querySelectorAll("#graph .node"));
  function make(tag, text, cls) {
    var e = document.createElement(tag);
    if (text !== undefined) e.textContent = text;
    if (cls) e.className = cls;
    return e;
  }
  function quoted(position) { return "\u2018" + shown.tokens[position] + "\u2019"; }
  function edgeText(edge) {
    var kind = edge.label === edge.kind ? "" : " (" + edge.kind + ")";
    var lines = [edge.label + kind + ", importance " + edge.importance.toFixed(3)];
    if (edge.kind === "head") {
      lines.push("source: " + quoted(edge.source) + " at position " + edge.source);
      lines.push("target: " + quoted(edge.target) + " at position " + edge.target);
    } else {
      lines.push("at position " + edge.target + " " + quoted(edge.target));
    }
    lines.push(shown.rows[edge.from_point] + " \u2192 " + shown.rows[edge.to_point]);
    return lines.join("\n");
  }
  function place(event) {
    var x = Math.min(event.clientX + 14, window.innerWidth - tip.offsetWidth - 4);
    tip.style.left = Math.max(0, x) + "px";
    tip.style.top = (event.clientY + 16) + "px";
  }
  edges.forEach(function (g) {
    var edge = data.edges[Number(g.dataset.edge)];
    g.addEventListener("mouseenter", function (event) {
      tip.textContent = edgeText(edge); tip.hidden = false; place(event);
    });
    g.addEventListener("mousemove", place);
    g.addEventListener("mouseleave", function () { tip.hidden = true; });
  });
  function table(rows, first, second, bars) {
    var t = make("table");
    var head = make("tr"); head.appendChild(make("th", first)); head.appendChild(make("th", second));
    if (bars) head.appendChild(make("th", ""));
    t.appendChild(head);
    rows.forEach(function (row) {
      var tr = make("tr");
      tr.appendChild(make("td", row[0], "text-cell")); tr.appendChild(make("td", row[1]));
      if (bars) {
        var cell = make("td"), bar = make("div", undefined, "bar");
        bar.style.width = Math.round(100 * Math.max(0, Math.min(1, row[2]))) + "%";
        cell.style.width = "35%"; cell.appendChild(bar); tr.appendChild(cell);
      }
      t.appendChild(tr);
    });
    return t;
  }
  function section(title, rows, first, second, bars) {
    if (!rows.length) return;
    panel.appendChild(make("h4", title));
    panel.appendChild(table(rows, first, second, bars));
  }
  function touches(edge, node, end) {
    return end === "in" ? edge.to_point === node.point && edge.target === node.position
                        : edge.from_point === node.point && edge.source === node.position;
  }
  function edgeRows(node, end) {
    return data.edges.filter(function (edge) { return touches(edge, node, end); })
      .sort(function (a, b) { return b.importance - a.importance; })
      .map(function (edge) {
        var other = end === "in" ? edge.source : edge.target;
        return [edge.label + (end === "in" ? " \u2190 " : " \u2192 ") + quoted(other) + " " + other,
                edge.importance.toFixed(3), edge.importance];
      });
  }
  function select(index, dim) {
    var node = data.nodes[index];
    nodes.forEach(function (c) { c.classList.toggle("selected", Number(c.dataset.node) === index); });
    edges.forEach(function (g) {
      var edge = data.edges[Number(g.dataset.edge)];
      g.classList.toggle("dim", dim && !(touches(edge, node, "in") || touches(edge, node, "out")));
    });
    panel.textContent = "";
    panel.appendChild(make("h3", node.name + " \u00b7 " + shown.rows[node.point]));
    panel.appendChild(make("p", shown.points[node.point] + ", position " + node.position + " " +
                           quoted(node.position)));
    section("logit lens: top tokens", node.lens.map(function (s, k) {
      return ["\u2018" + shown.lens[index][k][0] + "\u2019", shown.lens[index][k][1], s.score]; }),
      "token", "p", true);
    section("largest terms of its sum", node.top_terms.map(function (s) {
      return [s.name, s.score.toFixed(3), s.score]; }), "term", "importance", true);
    section("largest neurons of the MLP output", node.top_neurons.map(function (s) {
      return [s.name, s.score.toFixed(3), s.score]; }), "neuron", "importance", true);
    section("kept edges into it", edgeRows(node, "in"), "edge", "importance", true);
    section("kept edges out of it", edgeRows(node, "out"), "edge", "importance", true);
  }
  function clear() {
    nodes.forEach(function (c) { c.classList.remove("selected"); });
    edges.forEach(function (g) { g.classList.remove("dim"); });
  }
  nodes.forEach(function (c) {
    var index = Number(c.dataset.node);
    c.addEventListener("click", function () { select(index, true); });
    c.addEventListener("keydown", function (event) {
      if (event.key === "Enter" || event.key === " ") { event.preventDefault(); select(index, true); }
      if (event.key === "Escape") { clear(); }
    });
  });
  var start = data.nodes.findIndex(function (n) {
    return n.point === 2 * data.n_layers && n.position === data.position; });
  if (start >= 0) select(start, false);  // the panel filled, nothing dimmed
})();
"""
