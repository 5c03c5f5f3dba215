/* headscope report: draws the page from the JSON in #headscope-data. No libraries, no network. */
(function () {
  "use strict";

  // ---------------------------------------------------------------- helpers

  var SVG_NS = (function () {
    // The SVG namespace, read from the parser instead of written out as a URL.
    var probe = document.createElement("div");
    probe.innerHTML = "<svg></svg>";
    return probe.firstChild.namespaceURI;
  })();

  function el(tag, attrs, children) {
    var node = document.createElement(tag);
    setAttrs(node, attrs);
    append(node, children);
    return node;
  }

  function svg(tag, attrs, children) {
    var node = document.createElementNS(SVG_NS, tag);
    setAttrs(node, attrs);
    append(node, children);
    return node;
  }

  function setAttrs(node, attrs) {
    if (!attrs) return;
    Object.keys(attrs).forEach(function (key) {
      var value = attrs[key];
      if (value === null || value === undefined || value === false) return;
      if (key === "text") node.textContent = String(value);
      else if (key === "className") node.setAttribute("class", value);
      else node.setAttribute(key, value === true ? "" : String(value));
    });
  }

  function append(node, children) {
    if (children === null || children === undefined) return;
    if (!Array.isArray(children)) children = [children];
    children.forEach(function (child) {
      if (child === null || child === undefined || child === false) return;
      node.appendChild(typeof child === "object" ? child : document.createTextNode(String(child)));
    });
  }

  function isNum(v) {
    return typeof v === "number" && isFinite(v);
  }

  function fmt(v, digits) {
    return isNum(v) ? v.toFixed(digits === undefined ? 3 : digits) : "\u2014";
  }

  function fmtCell(v) {
    if (v === null || v === undefined) return "\u2014";
    if (typeof v === "number") {
      if (!isFinite(v)) return "\u2014";
      if (Number.isInteger(v)) return String(v);
      if (v !== 0 && Math.abs(v) < 0.001) return v.toExponential(2);
      return v.toFixed(3);
    }
    return String(v);
  }

  function fmtCI(lo, hi) {
    return isNum(lo) && isNum(hi) ? "[" + fmt(lo) + ", " + fmt(hi) + "]" : "";
  }

  function ranges(xs) {
    var sorted = (xs || []).filter(isNum).slice().sort(function (a, b) { return a - b; });
    var out = [];
    var i = 0;
    while (i < sorted.length) {
      var j = i;
      while (j + 1 < sorted.length && sorted[j + 1] <= sorted[j] + 1) j++;
      if (sorted[j] - sorted[i] >= 2) out.push(sorted[i] + "\u2013" + sorted[j]);
      else if (sorted[j] !== sorted[i]) out.push(sorted[i] + ", " + sorted[j]);
      else out.push(String(sorted[i]));
      i = j + 1;
    }
    return out.join(", ");
  }

  function textColorFor(hex) {
    var m = /^#([0-9a-f]{2})([0-9a-f]{2})([0-9a-f]{2})$/i.exec(hex || "");
    if (!m) return "#1d2125";
    var lum = [m[1], m[2], m[3]].map(function (h) {
      var c = parseInt(h, 16) / 255;
      return c <= 0.03928 ? c / 12.92 : Math.pow((c + 0.055) / 1.055, 2.4);
    });
    var L = 0.2126 * lum[0] + 0.7152 * lum[1] + 0.0722 * lum[2];
    return L > 0.33 ? "#1d2125" : "#ffffff";
  }

  function tokenText(t) {
    var s = String(t);
    if (s === "") return "\u2205";
    return s.replace(/\r/g, "\u240d").replace(/\n/g, "\u21b5").replace(/\t/g, "\u21e5");
  }

  function key(l, h) {
    return l + "," + h;
  }

  function plural(n, one, many) {
    return n + " " + (n === 1 ? one : many);
  }

  // ---------------------------------------------------------------- data

  var DATA;
  var main = document.getElementById("main");
  try {
    DATA = JSON.parse(document.getElementById("headscope-data").textContent);
  } catch (err) {
    main.appendChild(el("p", { className: "noscript", text: "The report data could not be read: " + err }));
    return;
  }

  var model = DATA.model || {};
  var roles = Array.isArray(DATA.roles) ? DATA.roles : [];
  var heads = Array.isArray(DATA.heads) ? DATA.heads : [];
  var tables = Array.isArray(DATA.tables) ? DATA.tables : [];
  var examples = Array.isArray(DATA.examples) ? DATA.examples : [];

  var roleInfo = {}; // label -> {label, meaning, color}
  var roleOrder = [];
  roles.forEach(function (r) {
    if (!r || typeof r.label !== "string" || roleInfo[r.label]) return;
    roleInfo[r.label] = r;
    roleOrder.push(r.label);
  });
  function noteRole(label) {
    if (label && !roleInfo[label]) {
      roleInfo[label] = { label: label, meaning: "", color: "#b7bcc2" };
      roleOrder.push(label);
    }
  }
  heads.forEach(function (h) { noteRole(h && h.role); });
  tables.forEach(function (t) { (t.rows || []).forEach(function (r) { noteRole(r && r.role); }); });
  var roleVisible = {};
  roleOrder.forEach(function (label) { roleVisible[label] = true; });

  var headAt = {};
  var nLayers = isNum(model.layers) ? model.layers : 0;
  var nHeads = isNum(model.heads) ? model.heads : 0;
  heads.forEach(function (h) {
    if (!h || !isNum(h.layer) || !isNum(h.head)) return;
    headAt[key(h.layer, h.head)] = h;
    nLayers = Math.max(nLayers, h.layer + 1);
    nHeads = Math.max(nHeads, h.head + 1);
  });

  // An analysis' section may paint the grid itself: <div id="head-cards" data-paint="kind"> whose
  // <template data-head-card="l,h"> carry each cell's colour, label, tooltip line and filter fields.
  var cardHolder = document.getElementById("head-cards");
  var painted = !!(cardHolder && cardHolder.getAttribute("data-paint"));
  var cardCell = {};
  if (painted) {
    Array.prototype.forEach.call(cardHolder.querySelectorAll("template[data-head-card]"), function (t) {
      var d = t.dataset;
      cardCell[d.headCard] = {
        color: /^#[0-9a-fA-F]{6}$/.test(d.color || "") ? d.color : "#b7bcc2",
        label: d.label || "", fallback: d.fallback || d.label || "", line: d.line || "",
        kind: d.kind || "", template: d.template || "",
        templates: (d.templates || "").split(",").filter(Boolean),
        roles: (d.roles || "").split(",").filter(Boolean), share: Number(d.share),
      };
    });
  }

  // Per table: rows by head, the row count and the largest |score| (for signed axes).
  var tableInfo = tables.map(function (t) {
    var byHead = {};
    var maxAbs = 0;
    (t.rows || []).forEach(function (r) {
      byHead[key(r.layer, r.head)] = r;
      if (isNum(r.score)) maxAbs = Math.max(maxAbs, Math.abs(r.score));
    });
    return { table: t, byHead: byHead, count: (t.rows || []).length, maxAbs: maxAbs || 1 };
  });

  function roleChip(label) {
    if (!label) return el("span", { className: "muted", text: "\u2014" });
    var info = roleInfo[label];
    if (label === "sink") return el("span", { className: "role-chip sink", text: label });
    var bg = info ? info.color : "#b7bcc2";
    return el("span", {
      className: "role-chip",
      style: "background:" + bg + ";color:" + textColorFor(bg),
      title: info && info.meaning ? info.meaning : null,
      text: label,
    });
  }

  // ---------------------------------------------------------------- tooltip

  var tooltip = document.getElementById("tooltip");
  if (!tooltip) {
    tooltip = el("div", { id: "tooltip", "data-testid": "tooltip", role: "tooltip", hidden: true });
    document.body.appendChild(tooltip);
  }

  function showTooltip(text, x, y) {
    tooltip.textContent = text;
    tooltip.hidden = false;
    var w = tooltip.offsetWidth;
    var h = tooltip.offsetHeight;
    var left = Math.min(x + 12, window.innerWidth - w - 4);
    var top = y + 14;
    if (top + h > window.innerHeight - 4) top = Math.max(4, y - h - 10);
    tooltip.style.left = Math.max(4, left) + "px";
    tooltip.style.top = top + "px";
  }

  function hideTooltip() {
    tooltip.hidden = true;
  }

  function headSummary(l, h) {
    if (cardCell[key(l, h)]) return cardCell[key(l, h)].line;
    var head = headAt[key(l, h)];
    var name = "L" + l + "H" + h;
    if (!head) return name + " \u00b7 no data";
    var parts = [name, head.role || "none"];
    var score = "score " + fmt(head.score);
    var ci = fmtCI(head.ci_low, head.ci_high);
    if (ci) score += " " + ci;
    parts.push(score);
    if (isNum(head.baseline)) parts.push("baseline " + fmt(head.baseline));
    return parts.join(" \u00b7 ");
  }

  // ---------------------------------------------------------------- header

  function buildHeader() {
    var header = document.getElementById("header");
    if (!header) {
      header = el("header", { id: "header" }, el("h1", { id: "title", text: DATA.title || "headscope report" }));
      document.body.insertBefore(header, main);
    }
    var facts = el("dl", { className: "facts", "data-testid": "facts" });
    function fact(label, value, testid) {
      facts.appendChild(el("dt", { text: label }));
      facts.appendChild(el("dd", { "data-testid": testid || null }, value));
    }
    fact("model", model.name || "\u2014", "model-name");
    fact("layers", String(isNum(model.layers) ? model.layers : nLayers), "layers");
    var headsText =
      (isNum(model.heads) ? model.heads : nHeads) + " query heads / " +
      (isNum(model.kv_heads) ? model.kv_heads : "?") + " KV heads (group size " +
      (isNum(model.group_size) ? model.group_size : "?") + ")";
    var dims = [];
    if (isNum(model.head_dim)) dims.push("head dim " + model.head_dim);
    if (isNum(model.d_model)) dims.push("d_model " + model.d_model);
    if (dims.length) headsText += "; " + dims.join(", ");
    fact("heads", headsText, "heads");
    var local = Array.isArray(model.local_layers) ? model.local_layers : [];
    var glob = Array.isArray(model.global_layers) ? model.global_layers : [];
    var attn;
    if (local.length) {
      attn = "local" + (isNum(model.window) ? " (window " + model.window + ")" : "") + ": " + ranges(local) +
        "; global: " + (glob.length ? ranges(glob) : "none");
    } else {
      attn = "global in every layer";
    }
    if (typeof model.causal === "boolean") attn += model.causal ? " \u00b7 causal" : " \u00b7 bidirectional";
    fact("attention", attn, "attention");
    var datasets = Array.isArray(DATA.datasets) ? DATA.datasets : [];
    if (datasets.length) {
      fact("data", el("ul", null, datasets.map(function (d) {
        return el("li", null, [el("code", { text: d.data }), d.description ? " \u2014 " + d.description : ""]);
      })), "datasets");
    }
    fact("headscope", DATA.headscope || "\u2014", "version");
    fact("command", el("code", { text: DATA.command || "" }), "command");
    fact("created", DATA.created || "\u2014", "created");
    header.appendChild(facts);
  }

  // ---------------------------------------------------------------- role map

  var cells = []; // cells[layer][head]
  var focusL = 0;
  var focusH = 0;
  var selectedCell = null;

  function paintCell(cell, l, h) {
    var painted_ = cardCell[key(l, h)];
    if (painted_) {
      // A detector role keeps its badge (and label) while the legend shows that role.
      var shownRoles = painted_.roles.filter(function (r) { return roleVisible[r] !== false; });
      cell.classList.remove("sink", "has-role");
      cell.classList.toggle("role-badge", shownRoles.length > 0);
      cell.style.background = painted_.color;
      cell.style.color = textColorFor(painted_.color);
      cell.textContent = (shownRoles.length ? shownRoles[0] : painted_.fallback) || "\u00b7";
      cell.setAttribute("data-role", shownRoles[0] || "");
      cell.setAttribute("data-kind", painted_.kind);
      cell.setAttribute("aria-label", headSummary(l, h));
      return;
    }
    var head = headAt[key(l, h)];
    var role = head ? head.role : "";
    var shown = role && roleVisible[role] !== false;
    cell.classList.remove("sink", "has-role");
    cell.style.background = "";
    cell.style.color = "";
    if (shown && role === "sink") {
      cell.classList.add("sink");
      cell.textContent = role;
    } else if (shown) {
      var color = roleInfo[role] ? roleInfo[role].color : "#b7bcc2";
      cell.classList.add("has-role");
      cell.style.background = color;
      cell.style.color = textColorFor(color);
      cell.textContent = role;
    } else {
      cell.textContent = "\u00b7";
    }
    cell.setAttribute("data-role", role || "");
    cell.setAttribute("aria-label", headSummary(l, h));
  }

  function repaintGrid() {
    for (var l = 0; l < cells.length; l++) {
      for (var h = 0; h < cells[l].length; h++) paintCell(cells[l][h], l, h);
    }
  }

  function focusCell(l, h) {
    if (!cells.length) return;
    l = Math.max(0, Math.min(nLayers - 1, l));
    h = Math.max(0, Math.min(nHeads - 1, h));
    var old = cells[focusL] && cells[focusL][focusH];
    if (old) old.tabIndex = -1;
    focusL = l;
    focusH = h;
    var cell = cells[l][h];
    cell.tabIndex = 0;
    cell.focus();
  }

  function countLine() {
    var counts = {};
    var withRole = 0;
    var sink = 0;
    var none = 0;
    heads.forEach(function (h) {
      if (!h) return;
      if (!h.role) none++;
      else if (h.role === "sink") sink++;
      else {
        withRole++;
        counts[h.role] = (counts[h.role] || 0) + 1;
      }
    });
    var detail = roleOrder
      .filter(function (r) { return r !== "sink" && counts[r]; })
      .map(function (r) { return r + " " + counts[r]; });
    var text = plural(withRole, "head", "heads") + " with a role" + (detail.length ? " (" + detail.join(", ") + ")" : "") +
      "; " + sink + " sink; " + none + " none";
    var missing = nLayers * nHeads - Object.keys(headAt).length;
    if (missing > 0) text += "; " + missing + " without data";
    return text;
  }

  function buildMap(top) {
    var section = el("section", { className: "map", id: "role-map", "aria-labelledby": "map-title" });
    section.appendChild(el("h2", { id: "map-title", text: "Role map" }));

    var legend = el("div", { className: "legend", "data-testid": "legend", role: "group", "aria-label": "roles shown in the map" });
    roleOrder.forEach(function (label) {
      var info = roleInfo[label];
      var box = el("input", { type: "checkbox", "data-role": label, checked: true });
      box.checked = true;
      box.addEventListener("change", function () {
        roleVisible[label] = box.checked;
        repaintGrid();
      });
      var swatch = el("span", {
        className: "swatch",
        "aria-hidden": "true",
        style: label === "sink" ? "background:var(--sink-bg)" : "background:" + info.color,
      });
      legend.appendChild(el("label", null, [box, swatch, label + (info.meaning ? " \u2014 " + info.meaning : "")]));
    });
    section.appendChild(legend);

    var grid = el("div", {
      className: "grid",
      role: "grid",
      "data-testid": "grid",
      "aria-label": "roles by layer (rows) and head (columns); arrow keys move, Enter opens a head",
      style: "grid-template-columns:auto repeat(" + Math.max(nHeads, 1) + ", minmax(var(--cell), max-content))",
    });
    var headRow = el("div", { className: "row", role: "row" }, el("div", { className: "corner", role: "columnheader" }));
    for (var h = 0; h < nHeads; h++) headRow.appendChild(el("div", { className: "colhead", role: "columnheader", text: "H" + h }));
    grid.appendChild(headRow);
    for (var l = 0; l < nLayers; l++) {
      var row = el("div", { className: "row", role: "row" }, el("div", { className: "rowhead", role: "rowheader", text: "L" + l }));
      cells.push([]);
      for (h = 0; h < nHeads; h++) {
        var cell = el("div", {
          className: "cell" + (headAt[key(l, h)] ? "" : " missing"),
          role: "gridcell",
          tabindex: l === 0 && h === 0 ? "0" : "-1",
          "data-testid": "cell",
          "data-layer": l,
          "data-head": h,
          "aria-selected": "false",
        });
        paintCell(cell, l, h);
        cells[l].push(cell);
        row.appendChild(cell);
      }
      grid.appendChild(row);
    }
    if (!nLayers || !nHeads) grid.appendChild(el("p", { className: "empty", text: "No heads." }));

    function cellOf(target) {
      var node = target && target.closest ? target.closest(".cell") : null;
      return node && grid.contains(node) ? node : null;
    }
    function pos(cell) {
      return [Number(cell.getAttribute("data-layer")), Number(cell.getAttribute("data-head"))];
    }

    grid.addEventListener("click", function (ev) {
      var cell = cellOf(ev.target);
      if (!cell) return;
      var p = pos(cell);
      focusCell(p[0], p[1]);
      openPanel(p[0], p[1], cell, false);
    });
    grid.addEventListener("keydown", function (ev) {
      var cell = cellOf(ev.target);
      if (!cell) return;
      var p = pos(cell);
      var l = p[0];
      var h = p[1];
      switch (ev.key) {
        case "ArrowUp": l -= 1; break;
        case "ArrowDown": l += 1; break;
        case "ArrowLeft": h -= 1; break;
        case "ArrowRight": h += 1; break;
        case "Home": h = 0; if (ev.ctrlKey) l = 0; break;
        case "End": h = nHeads - 1; if (ev.ctrlKey) l = nLayers - 1; break;
        case "PageUp": l -= 5; break;
        case "PageDown": l += 5; break;
        case "Enter":
        case " ":
        case "Spacebar":
          ev.preventDefault();
          openPanel(l, h, cell, false);
          return;
        case "Escape":
          if (!panel.hidden) { ev.preventDefault(); closePanel(); }
          return;
        default:
          return;
      }
      ev.preventDefault();
      focusCell(l, h);
      // With a head open, the arrows move the panel too: one head after another.
      if (!panel.hidden) openPanel(focusL, focusH, cells[focusL][focusH], false);
    });
    grid.addEventListener("mouseover", function (ev) {
      var cell = cellOf(ev.target);
      if (!cell) return;
      var p = pos(cell);
      showTooltip(headSummary(p[0], p[1]), ev.clientX, ev.clientY);
    });
    grid.addEventListener("mousemove", function (ev) {
      var cell = cellOf(ev.target);
      if (!cell || tooltip.hidden) return;
      var p = pos(cell);
      showTooltip(headSummary(p[0], p[1]), ev.clientX, ev.clientY);
    });
    grid.addEventListener("mouseout", function (ev) {
      if (!cellOf(ev.relatedTarget)) hideTooltip();
    });
    grid.addEventListener("focusin", function (ev) {
      var cell = cellOf(ev.target);
      if (!cell) return;
      var p = pos(cell);
      focusL = p[0];
      focusH = p[1];
      var r = cell.getBoundingClientRect();
      showTooltip(headSummary(p[0], p[1]), r.left - 12, r.bottom - 8);
    });
    grid.addEventListener("focusout", function (ev) {
      if (!cellOf(ev.relatedTarget)) hideTooltip();
    });

    if (painted) section.appendChild(buildGridFilters());
    section.appendChild(el("div", { className: "grid-scroll" }, grid));
    section.appendChild(el("p", { className: "counts", "data-testid": "role-counts", text: countLine() }));
    section.appendChild(el("p", { className: "muted hint", text: "Click a cell, or move with the arrow keys and press Enter, to see a head's scores and attention." }));
    top.appendChild(section);
  }

  // ---------------------------------------------------------------- grid filters (painted grids)

  function buildGridFilters() {
    var kinds = [];
    var names = [];
    var roleNames = [];
    function note(list, v) { if (v && list.indexOf(v) < 0) list.push(v); }
    Object.keys(cardCell).forEach(function (k) {
      var c = cardCell[k];
      note(kinds, c.kind);
      note(names, c.template);
      c.templates.forEach(function (t) { note(names, t); });
      c.roles.forEach(function (r) { note(roleNames, r); });
    });
    names.sort();
    roleNames.sort();
    function choice(testid, values) {
      var sel = el("select", { "data-testid": testid }, el("option", { value: "", text: "any" }));
      values.forEach(function (v) { sel.appendChild(el("option", { value: v, text: v })); });
      return sel;
    }
    var kindSel = choice("grid-filter-kind", kinds);
    var nameSel = choice("grid-filter-template", names);
    var roleSel = choice("grid-filter-role", roleNames);
    var low = el("input", { type: "number", min: "0", max: "1", step: "0.05", value: "0", "data-testid": "grid-filter-min" });
    var high = el("input", { type: "number", min: "0", max: "1", step: "0.05", value: "1", "data-testid": "grid-filter-max" });
    var search = el("input", { type: "search", placeholder: "L18H6 or a template", "data-testid": "grid-filter-search", "aria-label": "find a head or a template" });
    var shown = el("span", { className: "muted", "data-testid": "grid-filter-count" });
    function apply() {
      var kind = kindSel.value;
      var name = nameSel.value;
      var role = roleSel.value;
      var lo = low.value === "" ? 0 : Number(low.value);
      var hi = high.value === "" ? 1 : Number(high.value);
      var q = search.value.trim().toLowerCase();
      var n = 0;
      var total = 0;
      for (var l = 0; l < cells.length; l++) {
        for (var h = 0; h < cells[l].length; h++) {
          var c = cardCell[key(l, h)];
          var pass = !!c;
          if (c) {
            if (kind && c.kind !== kind) pass = false;
            if (name && c.template !== name && c.templates.indexOf(name) < 0) pass = false;
            if (role && c.roles.indexOf(role) < 0) pass = false;
            if (!(c.share >= lo - 1e-9 && c.share <= hi + 1e-9)) pass = false;
            if (q) {
              var found = /^l\d+h\d+$/.test(q)
                ? q === ("l" + l + "h" + h)
                : c.template.toLowerCase().indexOf(q) >= 0 ||
                  c.templates.concat(c.roles).some(function (t) { return t.toLowerCase().indexOf(q) >= 0; });
              if (!found) pass = false;
            }
          }
          total++;
          if (pass) n++;
          cells[l][h].classList.toggle("dimmed", !pass);
          cells[l][h].setAttribute("data-dimmed", pass ? "false" : "true");
        }
      }
      shown.textContent = n + " of " + total + " heads shown";
    }
    [kindSel, nameSel, roleSel].forEach(function (x) { x.addEventListener("change", apply); });
    [low, high, search].forEach(function (x) { x.addEventListener("input", apply); });
    search.addEventListener("keydown", function (ev) {
      var m = /^l(\d+)h(\d+)$/i.exec(search.value.trim());
      if (ev.key === "Enter" && m && cells[+m[1]] && cells[+m[1]][+m[2]]) {
        focusCell(+m[1], +m[2]);
        openPanel(+m[1], +m[2], cells[+m[1]][+m[2]], false);
      }
    });
    var bar = el("div", { className: "grid-filters", "data-testid": "grid-filters", role: "group", "aria-label": "filter the heads" }, [
      el("label", null, ["kind ", kindSel]),
      el("label", null, ["template ", nameSel]),
      el("label", null, ["role ", roleSel]),
      el("label", null, ["explained ", low, " to ", high]),
      el("label", null, ["find ", search]),
      shown,
    ]);
    setTimeout(apply, 0);
    return bar;
  }

  // The URL's hash names a head (page.html#L18H6): it opens that head's panel, and opening one sets it.
  // On a page of two describe results, #b-L3H1 names a head of the second model.
  var HEAD_HASH = /^#(b-)?L(\d+)H(\d+)$/i;
  function openFromHash() {
    var m = HEAD_HASH.exec(window.location.hash || "");
    if (!m) return;
    var l = Number(m[2]);
    var h = Number(m[3]);
    if (m[1]) {
      openBeside(l, h, null);
      return;
    }
    if (!cells[l] || !cells[l][h]) return;
    focusCell(l, h);
    openPanel(l, h, cells[l][h], false);
  }

  // ---------------------------------------------------------------- head panel

  var panel;
  var panelOpener = null;
  var panelHead = null;

  function buildPanel(top) {
    panel = el("aside", { id: "panel", className: "panel", "data-testid": "panel", "aria-labelledby": "panel-title", hidden: true });
    panel.addEventListener("keydown", function (ev) {
      if (ev.key === "Escape") {
        ev.preventDefault();
        closePanel();
      }
    });
    top.appendChild(panel);
  }

  function closePanel() {
    panel.hidden = true;
    if (HEAD_HASH.test(window.location.hash || "") && window.history && window.history.replaceState) {
      window.history.replaceState(null, "", window.location.pathname + window.location.search);
    }
    panelHead = null;
    markCurrent(null, null);
    markBeside(null, null);
    hideTooltip();
    var opener = panelOpener;
    panelOpener = null;
    if (opener && document.contains(opener)) opener.focus();
  }

  function markCurrent(l, h) {
    if (selectedCell) {
      selectedCell.classList.remove("selected");
      selectedCell.setAttribute("aria-selected", "false");
    }
    selectedCell = l === null ? null : (cells[l] && cells[l][h]) || null;
    if (selectedCell) {
      selectedCell.classList.add("selected");
      selectedCell.setAttribute("aria-selected", "true");
    }
    var rows = document.querySelectorAll("table.data tbody tr.current");
    for (var i = 0; i < rows.length; i++) rows[i].classList.remove("current");
    if (l !== null) {
      rows = document.querySelectorAll('table.data tbody tr[data-layer="' + l + '"][data-head="' + h + '"]');
      for (i = 0; i < rows.length; i++) rows[i].classList.add("current");
    }
  }

  function scoreBar(info, row) {
    var t = info.table;
    var W = 150;
    var H = 16;
    var lo = 0;
    var hi = 1;
    if (t.signed) {
      lo = -info.maxAbs;
      hi = info.maxAbs;
    }
    function x(v) {
      var c = Math.max(lo, Math.min(hi, v));
      return ((c - lo) / (hi - lo)) * W;
    }
    var base = isNum(row.baseline) ? row.baseline : t.baseline;
    var label = "score " + fmt(row.score);
    if (isNum(row.ci_low) && isNum(row.ci_high)) label += ", 95% CI " + fmtCI(row.ci_low, row.ci_high);
    if (isNum(base)) label += ", baseline " + fmt(base);
    label += t.signed ? " (axis \u00b1" + fmt(info.maxAbs) + " nats)" : " (axis 0\u20131)";
    var parts = [svg("title", { text: label }), svg("rect", { x: 0, y: 3, width: W, height: H - 6, fill: "#eceef0" })];
    if (t.signed) parts.push(svg("line", { x1: x(0), x2: x(0), y1: 0, y2: H, stroke: "#9aa0a6", "stroke-width": 1 }));
    if (isNum(row.score)) {
      var x0 = x(0);
      var x1 = x(row.score);
      parts.push(svg("rect", {
        x: Math.min(x0, x1), y: 4, width: Math.max(Math.abs(x1 - x0), 1), height: H - 8,
        fill: row.score < 0 ? "#c4503b" : "#3b73c4", "data-part": "bar",
      }));
    }
    if (isNum(row.ci_low) && isNum(row.ci_high)) {
      var a = x(row.ci_low);
      var b = x(row.ci_high);
      parts.push(svg("g", { stroke: "#1d2125", "stroke-width": 1.2, "data-part": "ci" }, [
        svg("line", { x1: a, x2: b, y1: H / 2, y2: H / 2 }),
        svg("line", { x1: a, x2: a, y1: H / 2 - 3, y2: H / 2 + 3 }),
        svg("line", { x1: b, x2: b, y1: H / 2 - 3, y2: H / 2 + 3 }),
      ]));
    }
    if (isNum(base)) {
      var xb = x(base);
      parts.push(svg("line", { x1: xb, x2: xb, y1: 0, y2: H, stroke: "#d4590f", "stroke-width": 2, "data-part": "baseline" }));
    }
    return svg("svg", {
      width: W, height: H, viewBox: "0 0 " + W + " " + H, role: "img", "aria-label": label,
      "data-testid": "panel-bar", "data-table": t.id, overflow: "visible",
    }, parts);
  }

  function decodeMap(b64, n) {
    var bin;
    try {
      bin = atob(b64);
    } catch (err) {
      return null;
    }
    if (bin.length !== n * n) return null;
    var out = new Uint8Array(bin.length);
    for (var i = 0; i < bin.length; i++) out[i] = bin.charCodeAt(i);
    return out;
  }

  function heatmap(example, l, h) {
    var tokens = Array.isArray(example.tokens) ? example.tokens : [];
    var n = tokens.length;
    var name = String(example.name || "example");
    var fig = el("figure", { className: "heatmap-fig", "data-example": name });
    fig.appendChild(el("figcaption", { text: name + " (" + plural(n, "token", "tokens") + ")" }));
    var b64 = example.maps ? example.maps[key(l, h)] : undefined;
    if (typeof b64 !== "string") {
      fig.appendChild(el("p", { className: "empty", text: "No attention map for this head." }));
      return fig;
    }
    var values = n ? decodeMap(b64, n) : null;
    if (!values) {
      fig.appendChild(el("p", { className: "empty", text: "The attention map could not be read." }));
      return fig;
    }
    var c = Math.max(10, Math.min(24, Math.floor(640 / n)));
    var fs = Math.min(13, c - 1);
    var side = n * c;
    var wrap = el("div", { className: "hm", style: "grid-template-columns:auto " + side + "px;grid-template-rows:auto " + side + "px" });
    wrap.appendChild(el("div", { className: "hm-corner" }));
    var keysRow = el("div", { className: "hm-keys", style: "width:" + side + "px", "aria-label": "key tokens" });
    var queryCol = el("div", { className: "hm-queries", "aria-label": "query tokens" });
    var keyEls = [];
    var queryEls = [];
    tokens.forEach(function (tok, i) {
      var title = i + ": " + JSON.stringify(String(tok));
      var k = el("span", { className: "hm-key", title: title, style: "width:" + c + "px;line-height:" + c + "px;font-size:" + fs + "px", text: tokenText(tok) });
      var q = el("span", { className: "hm-query", title: title, style: "height:" + c + "px;line-height:" + c + "px;font-size:" + fs + "px", text: tokenText(tok) });
      keyEls.push(k);
      queryEls.push(q);
      keysRow.appendChild(k);
      queryCol.appendChild(q);
    });
    var canvas = el("canvas", {
      width: n, height: n, "data-testid": "heatmap", "data-example": name, "data-layer": l, "data-head": h,
      role: "img", "aria-label": "attention of L" + l + "H" + h + " on " + name + ": query tokens down, key tokens across",
      style: "width:" + side + "px;height:" + side + "px",
    });
    var ctx = canvas.getContext("2d");
    if (ctx) {
      var img = ctx.createImageData(n, n);
      for (var i = 0; i < values.length; i++) {
        var t = values[i] / 255;
        img.data[4 * i] = Math.round(255 + (8 - 255) * t);
        img.data[4 * i + 1] = Math.round(255 + (48 - 255) * t);
        img.data[4 * i + 2] = Math.round(255 + (107 - 255) * t);
        img.data[4 * i + 3] = 255;
      }
      ctx.putImageData(img, 0, 0);
    }
    var lit = [];
    function clearLit() {
      lit.forEach(function (node) { node.classList.remove("hl"); });
      lit = [];
    }
    canvas.addEventListener("mousemove", function (ev) {
      var r = canvas.getBoundingClientRect();
      if (!r.width || !r.height) return;
      var col = Math.floor(((ev.clientX - r.left) / r.width) * n);
      var row = Math.floor(((ev.clientY - r.top) / r.height) * n);
      if (row < 0 || col < 0 || row >= n || col >= n) return;
      clearLit();
      queryEls[row].classList.add("hl");
      keyEls[col].classList.add("hl");
      lit = [queryEls[row], keyEls[col]];
      showTooltip(
        "query " + row + " " + JSON.stringify(String(tokens[row])) + " \u2192 key " + col + " " +
          JSON.stringify(String(tokens[col])) + ": " + (values[row * n + col] / 255).toFixed(3),
        ev.clientX, ev.clientY
      );
    });
    canvas.addEventListener("mouseleave", function () {
      clearLit();
      hideTooltip();
    });
    wrap.appendChild(keysRow);
    wrap.appendChild(queryCol);
    wrap.appendChild(canvas);
    fig.appendChild(wrap);
    fig.appendChild(el("div", { className: "hm-scale", "aria-hidden": "true" }, ["0", el("span", { className: "ramp" }), "1 (attention weight)"]));
    return fig;
  }

  // Fragments the page holds once for many cards (<template data-labels="ID">: axis labels, a
  // second model's card) fill the card's empty elements that name them (data-labels="ID"); a
  // fragment may name others (a card's labels), hence a few passes.
  function fillShared(holder) {
    for (var pass = 0; pass < 3; pass++) {
      var empty = Array.prototype.filter.call(holder.querySelectorAll("[data-labels]"), function (node) {
        return !node.childNodes.length;
      });
      if (!empty.length) break;
      empty.forEach(function (node) {
        var shared = document.querySelector('template[data-labels="' + node.getAttribute("data-labels") + '"]');
        if (shared && shared.content) node.appendChild(shared.content.cloneNode(true));
      });
    }
  }

  // The two grids drawn side by side (report a.json b.json): the cell of the head whose panel is open.
  var besideCell = null;
  function markBeside(side, k) {
    if (besideCell) besideCell.classList.remove("selected");
    besideCell = null;
    if (side === null) return;
    var p = k.split(",");
    besideCell = document.querySelector('[data-testid=beside-cell][data-side="' + side + '"][data-layer="' + p[0] + '"][data-head="' + p[1] + '"]');
    if (besideCell) besideCell.classList.add("selected");
  }

  // A head of the second model: its card beside a link to the first model's most similar head.
  function openBeside(l, h, opener) {
    var card = document.querySelector('template[data-beside-card="' + l + "," + h + '"]');
    if (!card || !card.content) return;
    panelOpener = opener || null;
    panelHead = "b:" + key(l, h);
    panel.textContent = "";
    panel.setAttribute("data-side", "b");
    panel.setAttribute("data-layer", l);
    panel.setAttribute("data-head", h);
    var title = el("h2", { id: "panel-title", tabindex: "-1", "data-testid": "panel-title", text: (card.getAttribute("data-model") || "second model") + ": L" + l + " H" + h });
    var close = el("button", { type: "button", className: "close", "aria-label": "close the head panel", title: "close (Esc)", text: "\u00d7" });
    close.addEventListener("click", closePanel);
    panel.appendChild(el("div", { className: "panel-head" }, [title, close]));
    var holder = el("div", { className: "head-card", "data-testid": "panel-card" });
    holder.appendChild(card.content.cloneNode(true));
    fillShared(holder);
    panel.appendChild(holder);
    panel.hidden = false;
    markCurrent(null, null);
    markBeside("b", key(l, h));
    var wanted = "#b-L" + l + "H" + h;
    if (window.location.hash !== wanted && window.history && window.history.replaceState) {
      window.history.replaceState(null, "", wanted);
    }
    var rect = panel.getBoundingClientRect();
    if (rect.top > window.innerHeight || rect.bottom < 0) panel.scrollIntoView({ block: "start" });
  }

  function openPanel(l, h, opener, moveFocus) {
    var head = headAt[key(l, h)];
    panelOpener = opener || null;
    panelHead = key(l, h);
    panel.textContent = "";
    panel.setAttribute("data-side", "a");
    panel.setAttribute("data-layer", l);
    panel.setAttribute("data-head", h);
    var kv = head && isNum(head.kv_group) ? head.kv_group : null;
    if (kv === null) {
      for (var i = 0; i < tableInfo.length && kv === null; i++) {
        var r0 = tableInfo[i].byHead[key(l, h)];
        if (r0 && isNum(r0.kv_group)) kv = r0.kv_group;
      }
    }
    var title = el("h2", { id: "panel-title", tabindex: "-1", "data-testid": "panel-title", text: "L" + l + " H" + h + " (KV group " + (kv === null ? "?" : kv) + ")" });
    var close = el("button", { type: "button", className: "close", "aria-label": "close the head panel", title: "close (Esc)", text: "\u00d7" });
    close.addEventListener("click", closePanel);
    panel.appendChild(el("div", { className: "panel-head" }, [title, close]));

    var roleLine = el("p", { className: "headrole" }, ["role: "]);
    if (head && head.role) {
      roleLine.appendChild(roleChip(head.role));
      var info = roleInfo[head.role];
      if (info && info.meaning) roleLine.appendChild(document.createTextNode(" \u2014 " + info.meaning));
      var ci = fmtCI(head.ci_low, head.ci_high);
      if (isNum(head.score)) {
        roleLine.appendChild(el("span", { className: "muted", text: " (score " + fmt(head.score) + (ci ? " " + ci : "") + (head.table ? " in " + head.table : "") + ")" }));
      }
    } else {
      roleLine.appendChild(document.createTextNode(head ? "none" : "no data for this head"));
    }
    panel.appendChild(roleLine);

    var tbody = el("tbody");
    tableInfo.forEach(function (infoT) {
      var row = infoT.byHead[key(l, h)];
      if (!row) return;
      var t = infoT.table;
      var ciText = fmtCI(row.ci_low, row.ci_high);
      tbody.appendChild(el("tr", { "data-table": t.id }, [
        el("td", { className: "t", title: t.summary || null, text: t.title || t.id }),
        el("td", { className: "num" }, [
          el("span", { "data-testid": "panel-score", "data-table": t.id, text: fmt(row.score) }),
          ciText ? el("span", { className: "muted", text: " " + ciText }) : null,
        ]),
        el("td", null, scoreBar(infoT, row)),
        el("td", { className: "num", "data-testid": "panel-rank", text: "rank " + row.rank + " / " + infoT.count }),
        el("td", null, row.role ? roleChip(row.role) : null),
      ]));
    });
    if (tbody.childNodes.length) {
      panel.appendChild(el("table", { className: "scores", "data-testid": "panel-scores" }, tbody));
    } else {
      panel.appendChild(el("p", { className: "empty", text: "No table has a row for this head." }));
    }

    var secondary = head && Array.isArray(head.secondary) ? head.secondary : [];
    panel.appendChild(el("p", { className: "secondary", "data-testid": "panel-secondary", text: "secondary roles: " + (secondary.length ? secondary.join(", ") : "none") }));
    // An analysis' section may hold a card per head (<template data-head-card="layer,head">): shown here.
    var card = document.querySelector('template[data-head-card="' + l + "," + h + '"]');
    if (card && card.content) {
      var holder = el("div", { className: "head-card", "data-testid": "panel-card" });
      holder.appendChild(card.content.cloneNode(true));
      fillShared(holder);
      panel.appendChild(holder);
    }

    if (examples.length) {
      panel.appendChild(el("h3", { text: "Attention (query rows \u00d7 key columns)" }));
      var maps = el("div", { className: "heatmaps" });
      examples.forEach(function (ex) {
        if (ex) maps.appendChild(heatmap(ex, l, h));
      });
      panel.appendChild(maps);
    }

    panel.hidden = false;
    markCurrent(l, h);
    markBeside("a", key(l, h));
    var wanted = "#L" + l + "H" + h;
    if (window.location.hash !== wanted && window.history && window.history.replaceState) {
      window.history.replaceState(null, "", wanted);
    }
    var rect = panel.getBoundingClientRect();
    if (moveFocus) {
      title.focus();
    } else if (rect.top > window.innerHeight || rect.bottom < 0) {
      panel.scrollIntoView({ block: "start" });
    }
  }

  // ---------------------------------------------------------------- tables

  var COLUMNS = [
    { key: "layer", label: "layer", num: true },
    { key: "head", label: "head", num: true },
    { key: "kv_group", label: "kv group", num: true },
    { key: "score", label: "score", num: true },
    { key: "ci", label: "95% CI", num: true },
    { key: "baseline", label: "baseline", num: true },
    { key: "n", label: "n", num: true },
    { key: "rank", label: "rank", num: true },
    { key: "role", label: "role", num: false },
  ];

  var filters = { layer: null, role: null, minScore: null };
  var tableStates = [];

  function rowBaseline(t, r) {
    return isNum(r.baseline) ? r.baseline : isNum(t.baseline) ? t.baseline : null;
  }

  function sortValue(t, r, col) {
    switch (col) {
      case "ci": return isNum(r.ci_low) ? r.ci_low : null;
      case "baseline": return rowBaseline(t, r);
      case "role": return r.role ? r.role : null;
      default: return isNum(r[col]) ? r[col] : null;
    }
  }

  function rowPasses(r) {
    if (filters.layer !== null && r.layer !== filters.layer) return false;
    if (filters.role !== null) {
      if (filters.role === "" ? !!r.role : r.role !== filters.role) return false;
    }
    if (filters.minScore !== null && !(isNum(r.score) && r.score >= filters.minScore)) return false;
    return true;
  }

  function applyFilters() {
    tableStates.forEach(function (st) {
      var shown = 0;
      st.items.forEach(function (item) {
        var ok = rowPasses(item.row);
        item.tr.hidden = !ok;
        if (ok) shown++;
      });
      st.shown.textContent = "showing " + shown + " of " + plural(st.items.length, "head", "heads");
      fixRoving(st);
    });
  }

  function visibleRows(st) {
    return Array.prototype.filter.call(st.tbody.rows, function (tr) { return !tr.hidden; });
  }

  function fixRoving(st) {
    var rows = visibleRows(st);
    var current = st.tbody.querySelector('tr[tabindex="0"]');
    if (current && !current.hidden) return;
    if (current) current.tabIndex = -1;
    if (rows.length) rows[0].tabIndex = 0;
  }

  function sortTable(st, col) {
    var dir = st.sortCol === col && st.sortDir === "ascending" ? "descending" : "ascending";
    st.sortCol = col;
    st.sortDir = dir;
    var sign = dir === "ascending" ? 1 : -1;
    var t = st.table;
    var items = st.items.slice().sort(function (a, b) {
      var va = sortValue(t, a.row, col);
      var vb = sortValue(t, b.row, col);
      if (va === null && vb === null) return a.index - b.index;
      if (va === null) return 1;
      if (vb === null) return -1;
      var cmp = typeof va === "number" && typeof vb === "number" ? va - vb : String(va).localeCompare(String(vb));
      return cmp !== 0 ? sign * cmp : a.index - b.index;
    });
    items.forEach(function (item) { st.tbody.appendChild(item.tr); });
    Array.prototype.forEach.call(st.thead.querySelectorAll("th"), function (th) {
      th.setAttribute("aria-sort", th.getAttribute("data-sort") === col ? dir : "none");
    });
    fixRoving(st);
  }

  function buildTableSection(t, index) {
    var rows = Array.isArray(t.rows) ? t.rows : [];
    var details = el("details", { className: "table-section", "data-table-section": t.id, open: index === 0 });
    var summary = el("summary", null, [el("h3", { text: t.title || t.id }), el("span", { className: "muted", text: " \u00b7 " + plural(rows.length, "head", "heads") })]);
    details.appendChild(summary);
    var meta = el("div", { className: "table-meta" });
    if (t.summary) meta.appendChild(el("p", { text: t.summary }));
    var facts = [];
    if (t.detector) facts.push("detector " + t.detector);
    if (t.relation) facts.push("relation " + t.relation);
    if (t.direction) facts.push("direction " + t.direction);
    if (t.data) facts.push("data " + t.data);
    if (isNum(t.baseline)) facts.push("baseline " + fmt(t.baseline));
    facts.push(t.signed ? "scores are signed, in nats around 0" : "scores are shares in [0, 1]");
    meta.appendChild(el("p", { text: facts.join(" \u00b7 ") }));
    details.appendChild(meta);

    var shown = el("p", { className: "shown", "data-testid": "shown", "data-table": t.id });
    details.appendChild(shown);

    var thead = el("thead");
    var headRow = el("tr");
    COLUMNS.forEach(function (col) {
      headRow.appendChild(el("th", { scope: "col", "data-sort": col.key, "aria-sort": "none" }, el("button", { type: "button", text: col.label })));
    });
    thead.appendChild(headRow);
    var tbody = el("tbody");
    var items = rows.map(function (r, i) {
      var base = rowBaseline(t, r);
      var tr = el("tr", { "data-layer": r.layer, "data-head": r.head, tabindex: i === 0 ? "0" : "-1" }, [
        el("td", { className: "num", "data-col": "layer", text: r.layer }),
        el("td", { className: "num", "data-col": "head", text: r.head }),
        el("td", { className: "num", "data-col": "kv_group", text: isNum(r.kv_group) ? r.kv_group : "\u2014" }),
        el("td", { className: "num", "data-col": "score", text: fmt(r.score) }),
        el("td", { className: "num", "data-col": "ci", text: fmtCI(r.ci_low, r.ci_high) || "\u2014" }),
        el("td", { className: "num", "data-col": "baseline", text: fmt(base) }),
        el("td", { className: "num", "data-col": "n", text: isNum(r.n) ? r.n : "\u2014" }),
        el("td", { className: "num", "data-col": "rank", text: isNum(r.rank) ? r.rank : "\u2014" }),
        el("td", { "data-col": "role" }, r.role ? roleChip(r.role) : ""),
      ]);
      tbody.appendChild(tr);
      return { tr: tr, row: r, index: i };
    });
    var table = el("table", { className: "data", "data-table": t.id }, [thead, tbody]);
    var st = { table: t, items: items, tbody: tbody, thead: thead, shown: shown, sortCol: null, sortDir: null };

    thead.addEventListener("click", function (ev) {
      var th = ev.target.closest ? ev.target.closest("th[data-sort]") : null;
      if (th) sortTable(st, th.getAttribute("data-sort"));
    });
    tbody.addEventListener("click", function (ev) {
      var tr = ev.target.closest ? ev.target.closest("tr") : null;
      if (!tr || !tbody.contains(tr)) return;
      setRowFocus(st, tr, false);
      openPanel(Number(tr.getAttribute("data-layer")), Number(tr.getAttribute("data-head")), tr, true);
    });
    tbody.addEventListener("keydown", function (ev) {
      var tr = ev.target.closest ? ev.target.closest("tr") : null;
      if (!tr || !tbody.contains(tr)) return;
      var rowsNow = visibleRows(st);
      var i = rowsNow.indexOf(tr);
      var next = null;
      switch (ev.key) {
        case "ArrowDown": next = rowsNow[Math.min(rowsNow.length - 1, i + 1)]; break;
        case "ArrowUp": next = rowsNow[Math.max(0, i - 1)]; break;
        case "Home": next = rowsNow[0]; break;
        case "End": next = rowsNow[rowsNow.length - 1]; break;
        case "Enter":
        case " ":
        case "Spacebar":
          ev.preventDefault();
          openPanel(Number(tr.getAttribute("data-layer")), Number(tr.getAttribute("data-head")), tr, true);
          return;
        default:
          return;
      }
      ev.preventDefault();
      if (next) setRowFocus(st, next, true);
    });

    if (!rows.length) details.appendChild(el("p", { className: "empty", text: "This table has no rows." }));
    details.appendChild(el("div", { className: "table-scroll" }, table));
    tableStates.push(st);
    return details;
  }

  function setRowFocus(st, tr, focus) {
    Array.prototype.forEach.call(st.tbody.querySelectorAll('tr[tabindex="0"]'), function (r) { r.tabIndex = -1; });
    tr.tabIndex = 0;
    if (focus) tr.focus();
  }

  function buildTables() {
    var section = el("section", { id: "tables", "aria-labelledby": "tables-title" });
    section.appendChild(el("h2", { id: "tables-title", text: "Tables" }));
    if (!tables.length) {
      section.appendChild(el("p", { className: "empty", text: "No tables in this report." }));
      main.appendChild(section);
      return;
    }
    var layerSel = el("select", { "data-testid": "filter-layer", "data-filter": "layer" }, el("option", { value: "", text: "any" }));
    for (var l = 0; l < nLayers; l++) layerSel.appendChild(el("option", { value: String(l), text: "L" + l }));
    var roleSel = el("select", { "data-testid": "filter-role", "data-filter": "role" }, [
      el("option", { value: "*", text: "any" }),
      el("option", { value: "", text: "none" }),
    ]);
    roleOrder.forEach(function (label) { roleSel.appendChild(el("option", { value: label, text: label })); });
    var minInput = el("input", { type: "number", step: "any", "data-testid": "filter-min-score", "data-filter": "min-score", placeholder: "any" });
    var reset = el("button", { type: "button", "data-testid": "filter-reset", text: "reset" });

    function readFilters() {
      filters.layer = layerSel.value === "" ? null : Number(layerSel.value);
      filters.role = roleSel.value === "*" ? null : roleSel.value;
      var v = minInput.value.trim() === "" ? NaN : Number(minInput.value);
      filters.minScore = isFinite(v) ? v : null;
      applyFilters();
    }
    layerSel.addEventListener("change", readFilters);
    roleSel.addEventListener("change", readFilters);
    minInput.addEventListener("input", readFilters);
    minInput.addEventListener("change", readFilters);
    reset.addEventListener("click", function () {
      layerSel.value = "";
      roleSel.value = "*";
      minInput.value = "";
      readFilters();
    });

    section.appendChild(el("div", { className: "filters", "data-testid": "filters", role: "search", "aria-label": "filter the tables" }, [
      el("label", null, ["layer ", layerSel]),
      el("label", null, ["role ", roleSel]),
      el("label", null, ["min score ", minInput]),
      reset,
    ]));
    tables.forEach(function (t, i) { section.appendChild(buildTableSection(t, i)); });
    main.appendChild(section);
    applyFilters();
  }

  // ---------------------------------------------------------------- summaries, notes

  function buildSummaries() {
    var summaries = Array.isArray(DATA.summaries) ? DATA.summaries : [];
    if (!summaries.length) return;
    var section = el("section", { id: "summaries", "aria-labelledby": "summaries-title" });
    section.appendChild(el("h2", { id: "summaries-title", text: "Summaries" }));
    summaries.forEach(function (s) {
      var columns = Array.isArray(s.columns) ? s.columns : [];
      var rows = Array.isArray(s.rows) ? s.rows : [];
      var table = el("table", { className: "plain", "data-testid": "summary" }, el("caption", { text: s.title || "" }));
      table.appendChild(el("thead", null, el("tr", null, columns.map(function (c) { return el("th", { scope: "col", text: c }); }))));
      var tbody = el("tbody");
      rows.forEach(function (r) {
        tbody.appendChild(el("tr", null, (Array.isArray(r) ? r : []).map(function (v) {
          return el("td", { className: typeof v === "number" ? "num" : null, text: fmtCell(v) });
        })));
      });
      table.appendChild(tbody);
      section.appendChild(el("div", { className: "table-scroll" }, table));
      if (!rows.length) section.appendChild(el("p", { className: "empty", text: "No rows." }));
    });
    main.appendChild(section);
  }

  function buildNotes() {
    var notes = Array.isArray(DATA.notes) ? DATA.notes : [];
    if (!notes.length) return;
    var section = el("section", { id: "notes", "aria-labelledby": "notes-title" });
    section.appendChild(el("h2", { id: "notes-title", text: "Notes" }));
    section.appendChild(el("ul", { className: "notes", "data-testid": "notes" }, notes.map(function (n) { return el("li", { text: n }); })));
    main.appendChild(section);
  }

  // ---------------------------------------------------------------- go

  buildHeader();
  var top = el("div", { className: "top" });
  main.appendChild(top);
  buildMap(top);
  buildPanel(top);
  buildTables();
  buildSummaries();
  buildNotes();
  window.addEventListener("scroll", hideTooltip, { passive: true });
  window.addEventListener("hashchange", openFromHash);
  // The two grids drawn side by side (report a.json b.json): a cell opens its head's panel.
  function openBesideCell(cell) {
    var l = Number(cell.getAttribute("data-layer"));
    var h = Number(cell.getAttribute("data-head"));
    if (cell.getAttribute("data-side") === "b") openBeside(l, h, cell);
    else if (cells[l] && cells[l][h]) openPanel(l, h, cell, false);
  }
  document.addEventListener("click", function (ev) {
    var cell = ev.target && ev.target.closest ? ev.target.closest("[data-testid=beside-cell]") : null;
    if (cell) openBesideCell(cell);
  });
  document.addEventListener("keydown", function (ev) {
    var cell = ev.target && ev.target.closest ? ev.target.closest("[data-testid=beside-cell]") : null;
    if (cell && ev.key === "Escape" && panel && !panel.hidden) {
      ev.preventDefault();
      closePanel();
      return;
    }
    if (!cell || (ev.key !== "Enter" && ev.key !== " ")) return;
    ev.preventDefault();
    openBesideCell(cell);
  });
  // With a head open and nothing else focused (a page opened at #L18H6), the arrows move the panel.
  document.addEventListener("keydown", function (ev) {
    if (!panel || panel.hidden || document.activeElement !== document.body) return;
    if (ev.key === "Escape") {
      ev.preventDefault();
      closePanel();
      return;
    }
    if (!cells.length || String(panelHead).indexOf("b:") === 0) return; // the second model's head: no grid here
    var moves = { ArrowUp: [-1, 0], ArrowDown: [1, 0], ArrowLeft: [0, -1], ArrowRight: [0, 1] };
    var step = moves[ev.key];
    if (!step) return;
    ev.preventDefault();
    focusCell(focusL + step[0], focusH + step[1]);
    openPanel(focusL, focusH, cells[focusL][focusH], false);
  });
  openFromHash();
})();
