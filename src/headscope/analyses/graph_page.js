/* headscope graph: draws the head graph from the JSON in #graph-data. No libraries, no network. */
(function () {
  "use strict";

  var holder = document.getElementById("graph");
  var raw = document.getElementById("graph-data");
  if (!holder || !raw) return;
  var G;
  try {
    G = JSON.parse(raw.textContent);
  } catch (err) {
    holder.appendChild(document.createTextNode("The graph data could not be read: " + err));
    return;
  }

  // ---------------------------------------------------------------- helpers

  var SVG_NS = (function () {
    // The SVG namespace, read from the parser instead of written out as a URL.
    var probe = document.createElement("div");
    probe.innerHTML = "<svg></svg>";
    return probe.firstChild.namespaceURI;
  })();

  function attrs(node, values) {
    Object.keys(values || {}).forEach(function (key) {
      var value = values[key];
      if (value === null || value === undefined || value === false) return;
      if (key === "text") node.textContent = String(value);
      else if (key === "className") node.setAttribute("class", value);
      else node.setAttribute(key, value === true ? "" : String(value));
    });
    return node;
  }

  function append(node, children) {
    (Array.isArray(children) ? children : [children]).forEach(function (child) {
      if (child === null || child === undefined) return;
      node.appendChild(typeof child === "string" ? document.createTextNode(child) : child);
    });
    return node;
  }

  function el(tag, values, children) {
    return append(attrs(document.createElement(tag), values), children);
  }

  function svg(tag, values, children) {
    return append(attrs(document.createElementNS(SVG_NS, tag), values), children);
  }

  function fmt(value, digits) {
    return value === null || value === undefined ? "\u2013" : Number(value).toFixed(digits === undefined ? 3 : digits);
  }

  function interval(low, high) {
    return low === null || low === undefined ? "" : "[" + fmt(low) + ", " + fmt(high) + "]";
  }

  // ---------------------------------------------------------------- the data

  var SIDES = G.sides;
  var SIDE_NAMES = { query: "queries from", key: "keys from", value: "values from" };
  var roleColor = {};
  (G.roles || []).forEach(function (r) { roleColor[r.label] = r.color; });
  var NO_ROLE = "(no role)";

  var heads = G.heads.map(function (h, i) {
    return { index: i, name: "L" + h.layer + "H" + h.head, info: h };
  });
  var headByName = {};
  heads.forEach(function (h) { headByName[h.name] = h; });

  var edges = G.edges.map(function (row, i) {
    var target = heads[row[0]];
    return {
      index: i, target: target.name, targetRole: target.info.role, side: SIDES[row[1]],
      source: G.names[row[2]], share: row[3], low: row[4], high: row[5], verified: row[6],
    };
  });
  var into = {};
  var outOf = {};
  edges.forEach(function (e) {
    (into[e.target] = into[e.target] || []).push(e);
    (outOf[e.source] = outOf[e.source] || []).push(e);
  });

  function roleOf(name) {
    if (headByName[name]) return headByName[name].info.role;
    return (G.source_roles || {})[name] || "";
  }

  function colorOf(role) {
    return role ? roleColor[role] || "#9aa5b1" : G.no_role_color;
  }

  // ---------------------------------------------------------------- layout

  var L = Math.max(G.layers, 1);
  var H = Math.max(G.heads_per_layer, 1);
  var COL = 58, ROW = 56, LEFT = 44, TOP = 18, R = 12;
  var positions = {};
  function rowY(layer) { return TOP + ROW * (L - 1 - layer) + ROW / 2; }
  function colX(column) { return LEFT + COL * (column + 0.5); }
  var bottom = TOP + ROW * L + ROW / 2;
  var embedLeft = LEFT + 6, embedRight = LEFT + COL * H - 6;

  var nodes = [];
  for (var l = 0; l < L; l++) {
    for (var h = 0; h < H; h++) nodes.push({ name: "L" + l + "H" + h, kind: "head", x: colX(h), y: rowY(l), layer: l, head: h });
    nodes.push({ name: "mlp" + l, kind: "mlp", x: colX(H) + 6, y: rowY(l), layer: l });
  }
  nodes.push({ name: "embed", kind: "embed", x: (embedLeft + embedRight) / 2, y: bottom });
  var extra = 0;
  G.names.forEach(function (name) {
    if (name === "embed" || /^L\d+H\d+$/.test(name) || /^mlp\d+$/.test(name)) return;
    nodes.push({ name: name, kind: "other", x: colX(H + extra) + 6, y: bottom });
    extra += 1;
  });
  var known = {};
  nodes.forEach(function (n) { known[n.name] = n; positions[n.name] = n; });
  // A source past the layout (it should not happen): drawn at the bottom rather than dropped.
  G.names.forEach(function (name) {
    if (known[name]) return;
    var n = { name: name, kind: "other", x: colX(H + extra) + 6, y: bottom };
    extra += 1;
    nodes.push(n);
    known[name] = positions[name] = n;
  });
  var width = colX(H + Math.max(extra, 1)) + COL / 2 + 8;
  var height = bottom + ROW / 2 + 4;

  // ---------------------------------------------------------------- controls

  var maxShare = edges.reduce(function (m, e) { return Math.max(m, e.share || 0); }, G.threshold || 0);
  var state = {
    sides: { query: true, key: true, value: true },
    role: "",
    threshold: G.threshold || 0,
    depth: 1,
    selected: null,
    hovered: null,
  };

  var controls = document.getElementById("graph-controls");
  SIDES.forEach(function (side) {
    var box = el("input", { type: "checkbox", checked: true, "data-testid": "graph-side-" + side });
    box.checked = true;
    box.addEventListener("change", function () { state.sides[side] = box.checked; update(); });
    controls.appendChild(el("label", null, [box, " " + side]));
  });
  var roleSelect = el("select", { "data-testid": "graph-role", "aria-label": "heads of one role" }, [
    el("option", { value: "", text: "any" }),
  ]);
  var roleLabels = [];
  heads.forEach(function (h) { if (roleLabels.indexOf(h.info.role || NO_ROLE) < 0) roleLabels.push(h.info.role || NO_ROLE); });
  roleLabels.sort();
  roleLabels.forEach(function (r) { roleSelect.appendChild(el("option", { value: r, text: r })); });
  roleSelect.addEventListener("change", function () { state.role = roleSelect.value; update(); });
  controls.appendChild(el("label", null, ["edges into heads of role ", roleSelect]));

  var step = 0.01;
  var slider = el("input", {
    type: "range", min: G.threshold || 0, max: Math.max(Math.ceil(maxShare * 100 - 1e-6) / 100, (G.threshold || 0) + step),
    step: step, value: G.threshold || 0, "data-testid": "graph-threshold", "aria-label": "least share",
  });
  var sliderText = el("span", { className: "graph-count", text: fmt(state.threshold, 2) });
  slider.addEventListener("input", function () {
    state.threshold = Number(slider.value);
    sliderText.textContent = fmt(state.threshold, 2);
    update();
  });
  controls.appendChild(el("label", null, ["share \u2265 ", slider, " ", sliderText]));

  var depthInput = el("input", { type: "number", min: 1, max: L, value: 1, step: 1, "data-testid": "graph-depth", "aria-label": "ancestors to depth" });
  depthInput.addEventListener("input", function () {
    var d = Math.round(Number(depthInput.value));
    if (d >= 1) { state.depth = Math.min(d, L); update(); }
  });
  controls.appendChild(el("label", null, ["sources to depth ", depthInput]));
  var count = el("span", { className: "graph-count", "data-testid": "graph-edge-count" });
  controls.appendChild(count);

  var roleLegend = document.getElementById("graph-roles");
  if (roleLegend) {
    roleLegend.appendChild(document.createTextNode("heads: "));
    (G.roles || []).concat([{ label: "", color: G.no_role_color }]).forEach(function (r) {
      roleLegend.appendChild(el("span", null, [
        el("span", { className: "side-swatch", style: "border:1px solid #888;background:" + r.color }),
        r.label || "no role",
      ]));
    });
  }

  // ---------------------------------------------------------------- the drawing

  var root = svg("svg", {
    className: "graph-svg", "data-testid": "graph-svg", width: width, height: height,
    viewBox: "0 0 " + width + " " + height, role: "img", "aria-label": "the head graph",
  });
  var edgeLayer = svg("g");
  var nodeLayer = svg("g");
  for (var layer = 0; layer < L; layer++) {
    root.appendChild(svg("text", { x: 6, y: rowY(layer) + 4, fill: "#6b7178", "font-size": 11, text: "L" + layer }));
  }
  root.appendChild(edgeLayer);
  root.appendChild(nodeLayer);

  function start(e) {
    var s = positions[e.source];
    var t = positions[e.target];
    if (s.kind === "embed") return [Math.min(Math.max(t.x, embedLeft), embedRight), s.y - 7];
    if (s.kind === "head") return [s.x, s.y - R];
    return [s.x, s.y - 8];
  }

  edges.forEach(function (e) {
    var t = positions[e.target];
    var from = start(e);
    var tx = t.x + (SIDES.indexOf(e.side) - 1) * 5;
    var ty = t.y + R;
    var mid = (from[1] + ty) / 2;
    e.path = svg("path", {
      className: "graph-edge", "data-testid": "graph-edge", "data-side": e.side, "data-source": e.source,
      "data-target": e.target, d: "M" + from[0] + " " + from[1] + " C" + from[0] + " " + mid + " " + tx + " " + mid + " " + tx + " " + ty,
      fill: "none", stroke: G.side_colors[e.side], "stroke-opacity": 0.75,
      "stroke-width": (0.75 + 5 * Math.min(Math.max(e.share || 0, 0), 1)).toFixed(2),
    }, svg("title", { text: e.source + " \u2192 " + e.target + " (" + e.side + ") " + fmt(e.share) + " " + interval(e.low, e.high) }));
    edgeLayer.appendChild(e.path);
  });

  nodes.forEach(function (n) {
    var measured = n.kind !== "head" || !!headByName[n.name];
    var shape;
    if (n.kind === "head") {
      shape = svg("circle", {
        className: "shape", cx: n.x, cy: n.y, r: R, fill: colorOf(roleOf(n.name)), stroke: "#5f666d",
        "stroke-width": 1, "stroke-dasharray": measured && headByName[n.name].info.unresolved ? "3 2" : null,
      });
    } else if (n.kind === "embed") {
      shape = svg("rect", { className: "shape", x: embedLeft, y: n.y - 7, width: embedRight - embedLeft, height: 14, rx: 3, fill: "#dfe3e8", stroke: "#5f666d" });
    } else {
      shape = svg("rect", { className: "shape", x: n.x - 8, y: n.y - 8, width: 16, height: 16, rx: 2, fill: "#eceef0", stroke: "#5f666d" });
    }
    var label = n.kind === "head" ? String(n.head) : n.kind === "mlp" ? "m" : n.name;
    var text = svg("text", {
      x: n.x, y: n.kind === "other" ? n.y + 20 : n.y + 3.5, "text-anchor": "middle",
      fill: "#1d2125", text: label,
    });
    n.element = svg("g", {
      className: "graph-node" + (measured ? "" : " off"), "data-testid": "graph-node", "data-node": n.name,
      "data-kind": n.kind, tabindex: 0, role: "button", "aria-label": n.name + (roleOf(n.name) ? " " + roleOf(n.name) : ""),
    }, [shape, text, svg("title", { text: n.name + (roleOf(n.name) ? " \u00b7 " + roleOf(n.name) : "") })]);
    n.element.addEventListener("mouseenter", function () { state.hovered = n.name; showFocus(); });
    n.element.addEventListener("mouseleave", function () { state.hovered = null; showFocus(); });
    n.element.addEventListener("click", function () { select(n.name, true); });
    n.element.addEventListener("keydown", function (ev) {
      if (ev.key === "Enter" || ev.key === " ") { ev.preventDefault(); select(n.name, true); }
      if (ev.key === "Escape") { ev.preventDefault(); select(null, true); }
    });
    nodeLayer.appendChild(n.element);
  });
  document.getElementById("graph-scroll").appendChild(root);

  // ---------------------------------------------------------------- filters and highlight

  function visible(e) {
    if (!state.sides[e.side]) return false;
    if (e.share === null || e.share < state.threshold - 1e-9) return false;
    if (state.role && (e.targetRole || NO_ROLE) !== state.role) return false;
    return true;
  }

  function update() {
    var shown = 0;
    edges.forEach(function (e) {
      e.shown = visible(e);
      if (e.shown) shown += 1;
      e.path.style.display = e.shown ? "" : "none";
    });
    nodes.forEach(function (n) {
      if (n.kind !== "head") return;
      var head = headByName[n.name];
      var off = !head || (state.role && (head.info.role || NO_ROLE) !== state.role);
      n.element.classList.toggle("off", !!off);
    });
    count.setAttribute("data-shown", String(shown));
    count.textContent = shown + " of " + edges.length + " edges shown";
    showFocus();
  }

  // The head's sources (the shown edges into it), their sources, ... to the chosen depth; a source
  // that is not a head (embed, an MLP) lights the edges it feeds.
  function lineage(name) {
    var litNodes = {};
    var litEdges = [];
    litNodes[name] = true;
    if (!headByName[name] && !/^L\d+H\d+$/.test(name)) {
      (outOf[name] || []).forEach(function (e) {
        if (!e.shown) return;
        litEdges.push(e);
        litNodes[e.target] = true;
      });
      return { nodes: litNodes, edges: litEdges };
    }
    var frontier = [name];
    for (var d = 0; d < state.depth && frontier.length; d++) {
      var next = [];
      frontier.forEach(function (target) {
        (into[target] || []).forEach(function (e) {
          if (!e.shown) return;
          litEdges.push(e);
          if (!litNodes[e.source]) {
            litNodes[e.source] = true;
            next.push(e.source);
          }
        });
      });
      frontier = next;
    }
    return { nodes: litNodes, edges: litEdges };
  }

  function showFocus() {
    var name = state.hovered || state.selected;
    nodes.forEach(function (n) {
      n.element.classList.remove("lit");
      n.element.classList.toggle("selected", n.name === state.selected);
    });
    edges.forEach(function (e) { e.path.classList.remove("lit"); });
    if (!name) {
      root.classList.remove("lit");
      showCard(null);
      return;
    }
    var found = lineage(name);
    root.classList.add("lit");
    Object.keys(found.nodes).forEach(function (n) { if (positions[n]) positions[n].element.classList.add("lit"); });
    found.edges.forEach(function (e) { e.path.classList.add("lit"); });
    showCard(name);
  }

  // ---------------------------------------------------------------- the card

  var card = document.getElementById("graph-card");

  function roleChip(role) {
    return el("span", { className: "side-swatch", style: "border:1px solid #888;background:" + colorOf(role) });
  }

  function isEdge(head, side, source) {
    return (into[head] || []).some(function (e) { return e.side === side && e.source === source && e.shown; });
  }

  function headCard(name) {
    var head = headByName[name];
    var parts = [];
    var role = roleOf(name);
    parts.push(el("h3", { "data-testid": "graph-card-title" }, [name + " ", roleChip(role), role || "no role"]));
    if (!head) {
      parts.push(el("p", { className: "muted", text: "Not measured in this graph (a source only)." }));
      parts.push(sourceOf(name));
      return parts;
    }
    var info = head.info;
    var facts = [
      (G.measure === "contrast" ? "contrast " : "margin ") + fmt(info.margin),
      "output " + fmt(info.output),
      info.windows + " windows",
      "kv group " + info.kv_group,
    ];
    parts.push(el("p", { text: facts.join(" \u00b7 ") }));
    if (info.unresolved) parts.push(el("p", { className: "muted", text: "queries and keys: no shares (" + info.unresolved + ")" }));
    if (info.value_unresolved) parts.push(el("p", { className: "muted", text: "values: no shares (" + info.value_unresolved + ")" }));
    SIDES.forEach(function (side) {
      var rows = (info.sources[side] || []).map(function (item) {
        var source = G.names[item[0]];
        var edge = isEdge(name, side, source);
        return el("tr", { "data-testid": "graph-card-source", "data-side": side, "data-source": source, className: edge ? "edge" : "" }, [
          el("td", { text: source }),
          el("td", { className: "muted", text: roleOf(source) }),
          el("td", { className: "num", text: fmt(item[1]) }),
          el("td", { className: "num", text: interval(item[2], item[3]) }),
          el("td", { className: "edge-mark", text: edge ? "edge" : "" }),
        ]);
      });
      parts.push(el("h4", null, [el("span", { className: "side-swatch", style: "background:" + G.side_colors[side] }), SIDE_NAMES[side]]));
      parts.push(rows.length ? el("table", { className: "scores" }, el("tbody", null, rows)) : el("p", { className: "muted", text: "no shares" }));
    });
    var out = (outOf[name] || []).filter(function (e) { return e.shown; });
    if (out.length) parts.push(sourceOf(name));
    return parts;
  }

  function sourceOf(name) {
    var out = (outOf[name] || []).filter(function (e) { return e.shown; });
    var text = out.length
      ? "feeds " + out.map(function (e) { return e.target + " (" + e.side + " " + fmt(e.share, 2) + ")"; }).join(", ")
      : "feeds no shown edge";
    return el("p", { "data-testid": "graph-card-feeds", text: text });
  }

  function showCard(name) {
    while (card.firstChild) card.removeChild(card.firstChild);
    if (!name) {
      card.appendChild(el("p", { className: "muted", text: "Hover or click a head." }));
      card.removeAttribute("data-node");
      return;
    }
    card.setAttribute("data-node", name);
    if (/^L\d+H\d+$/.test(name)) append(card, headCard(name));
    else append(card, [el("h3", { "data-testid": "graph-card-title", text: name }), sourceOf(name)]);
  }

  // ---------------------------------------------------------------- selection and the URL

  var HASH = /^#L(\d+)H(\d+)$/i;

  function select(name, fromClick) {
    state.selected = name;
    showFocus();
    if (!fromClick || !window.history || !window.history.replaceState) return;
    // replaceState, not location.hash: no hashchange, so the report's own panel does not jump.
    if (name && HASH.test("#" + name)) window.history.replaceState(null, "", "#" + name);
    else if (!name && HASH.test(window.location.hash || "")) window.history.replaceState(null, "", window.location.pathname + window.location.search);
  }

  function openFromHash() {
    var m = HASH.exec(window.location.hash || "");
    if (!m) return;
    var name = "L" + Number(m[1]) + "H" + Number(m[2]);
    if (!positions[name]) return;
    select(name, false);
    var scroller = document.getElementById("graph-scroll");
    var n = positions[name];
    scroller.scrollTop = Math.max(0, n.y - scroller.clientHeight / 2);
    scroller.scrollLeft = Math.max(0, n.x - scroller.clientWidth / 2);
    holder.scrollIntoView({ block: "start" });
  }

  update();
  // After the report's script has opened its own panel for the hash (it may scroll to it).
  function later() { setTimeout(openFromHash, 0); }
  if (document.readyState === "loading") document.addEventListener("DOMContentLoaded", later);
  else later();
  window.addEventListener("hashchange", later);
})();
