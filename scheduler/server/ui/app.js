// topoplace cluster view: reads v1/inspect/view and draws it with plain DOM elements.
// No framework, no build step, nothing fetched from outside the extender (see docs/ui.md).
"use strict";

const DETAIL_LIMIT = 300;     // a group of at most this many nodes is drawn node by node
const REFRESH_MS = 5000;
const LEVEL_LABEL = {
  "nvlink-domain": "NVLink domain", accelerator: "accelerator", leaf: "leaf",
  spine: "spine", core: "core", zone: "zone", cluster: "cluster",
};
const STATE_LABEL = { free: "free", bound: "whole GPU, bound", assumed: "whole GPU, being bound",
  reserved: "reserved for a gang", unhealthy: "unhealthy GPU", shared: "fractional share" };

let model = null;             // the view model plus indexes (see indexModel)
let focus = "";               // id of the group zoomed into ("" = the whole cluster)
let hoverGang = "";
const $ = (id) => document.getElementById(id);

function el(tag, cls, text) {
  const e = document.createElement(tag);
  if (cls) e.className = cls;
  if (text !== undefined) e.textContent = text;
  return e;
}

function indexModel(m) {
  const byId = new Map();
  const parent = new Map();
  const gangNodes = new Map();   // gang -> Set(node index)
  const nodeIndex = new Map(m.nodes.map((n, i) => [n.name, i]));
  for (const p of m.pods) {
    if (!p.gang) continue;
    if (!gangNodes.has(p.gang)) gangNodes.set(p.gang, new Set());
    const ni = nodeIndex.get(p.node);
    if (ni !== undefined) gangNodes.get(p.gang).add(ni);
  }
  function walk(g, up) {
    byId.set(g.id, g);
    if (up) parent.set(g.id, up);
    const s = { nodes: 0, gpus: 0, free: 0, used: 0, reserved: 0, bad: 0,
      unhealthy: 0, degraded: 0, cordoned: 0, all: [] };
    for (const c of g.children) {
      const cs = walk(c, g);
      for (const k of Object.keys(s)) {
        if (k === "all") s.all.push(...cs.all); else s[k] += cs[k];
      }
    }
    for (const i of g.nodes || []) {
      const n = m.nodes[i];
      s.nodes += 1; s.all.push(i); s.gpus += n.gpus.length;
      for (const st of n.gpus) {
        if (st === 0) s.free += 1; else if (st === 3) s.reserved += 1;
        else if (st === 4) s.bad += 1; else s.used += 1;
      }
      if (n.health === "unhealthy") s.unhealthy += 1;
      else if (n.health === "degraded") s.degraded += 1;
      if (n.cordoned) s.cordoned += 1;
    }
    g.stats = s;
    return s;
  }
  walk(m.root, null);
  return Object.assign(m, { byId, parent, gangNodes, nodeIndex });
}

function stateName(code) { return model.gpu_states[code]; }

function shortProduct(p) { return p.replace(/^NVIDIA-/, ""); }

function groupTitle(g) {
  return g.level === "cluster" ? "cluster" : `${LEVEL_LABEL[g.level] || g.level} ${g.name}`;
}

function statsText(s) {
  const bits = [`${s.nodes} node${s.nodes === 1 ? "" : "s"}`, `${s.free}/${s.gpus} GPUs free`];
  if (s.reserved) bits.push(`${s.reserved} reserved`);
  if (s.unhealthy) bits.push(`${s.unhealthy} unhealthy`);
  if (s.degraded) bits.push(`${s.degraded} degraded`);
  if (s.cordoned) bits.push(`${s.cordoned} cordoned`);
  return bits.join(" · ");
}

function filters() {
  return { ns: $("f-ns").value, gang: $("f-gang").value || hoverGang, product: $("f-product").value };
}

function nodeTile(i, f) {
  const n = model.nodes[i];
  const t = el("div", "node");
  t.dataset.node = n.name;
  t.dataset.health = n.health;
  if (n.health !== "healthy") t.classList.add(n.health);
  if (n.cordoned) t.classList.add("cordoned");
  if (f.product && n.product !== f.product) t.classList.add("off");
  t.title = `${n.name}\n${n.product || "no GPUs"} · ${n.topology}`;
  t.append(el("div", "nn", n.name), el("div", "np", n.product ? shortProduct(n.product) : "no GPUs"));
  const gpus = el("div", "gpus");
  let inGang = false;
  n.gpus.forEach((code, g) => {
    const st = stateName(code);
    const c = el("span", `gpu s-${st}`);
    c.dataset.gpu = String(g);
    c.dataset.state = st;
    const pi = n.pods[g];
    if (pi >= 0) {
      const p = model.pods[pi];
      c.dataset.pod = String(pi);
      if (p.gang) c.dataset.gang = p.gang;
      c.title = `GPU ${g}: ${STATE_LABEL[st]}\n${p.key}${p.gang ? `\ngang ${p.gang}` : ""}`;
      if (f.ns && p.ns !== f.ns) c.classList.add("dim");
      if (f.gang && p.gang === f.gang) { c.classList.add("hl"); inGang = true; }
    } else {
      c.title = `GPU ${g}: ${STATE_LABEL[st]}`;
      if (f.ns) c.classList.add("dim");
    }
    gpus.append(c);
  });
  t.append(gpus);
  if (inGang) t.classList.add("hl-node");
  let badge = "";
  if (n.health === "unhealthy") badge = `unhealthy: ${n.reasons[0] || "node unhealthy"}`;
  else if (n.cordoned) badge = "cordoned";
  else if (n.health === "degraded") badge = `degraded: ${n.reasons[0] || ""}`;
  else if (n.bad.length) badge = `${n.bad.length} GPU${n.bad.length > 1 ? "s" : ""} excluded`;
  if (badge) t.append(el("div", "badge", badge));
  return t;
}

function heatCell(i, f) {
  const n = model.nodes[i];
  const c = el("span", "hc");
  const used = n.gpus.filter((s) => s !== 0 && s !== 4).length;
  const frac = n.gpus.length ? used / n.gpus.length : 0;
  if (n.health === "unhealthy") c.classList.add("bad");
  else if (n.cordoned) c.classList.add("cord");
  else if (n.health === "degraded") c.classList.add("deg");
  else if (frac > 0) c.classList.add(frac >= 1 ? "o3" : frac >= 0.5 ? "o2" : "o1");
  if (f.product && n.product !== f.product) c.classList.add("dim");
  c.title = `${n.name}: ${used}/${n.gpus.length} GPUs used, ${n.health}${n.cordoned ? ", cordoned" : ""}`;
  return c;
}

function bar(s) {
  const b = el("div", "bar");
  const total = Math.max(1, s.gpus);
  for (const [k, color] of [["used", "var(--bound)"], ["reserved", "var(--reserved)"], ["bad", "var(--bad)"]]) {
    const part = el("span");
    part.style.width = `${(100 * s[k]) / total}%`;
    part.style.background = color;
    b.append(part);
  }
  return b;
}

function summaryTile(g, f) {
  const t = el("div", "summary");
  t.dataset.group = g.id;
  t.dataset.level = g.level;
  t.title = "click to zoom in";
  t.append(el("div", "gh", groupTitle(g)), el("div", "st", statsText(g.stats)), bar(g.stats));
  const heat = el("div", "heat");
  // One block per sub-group (a rack, a leaf...), so the fabric stays visible when aggregated.
  const blocks = g.children.length ? g.children.map((c) => [groupTitle(c), c.stats.all]) : [];
  if ((g.nodes || []).length || !blocks.length) blocks.push([groupTitle(g), g.nodes || []]);
  for (const [title, nodes] of blocks) {
    const b = el("div", "hb");
    b.title = title;
    for (const i of nodes) b.append(heatCell(i, f));
    heat.append(b);
  }
  t.append(heat);
  if (f.gang && model.gangNodes.has(f.gang) && g.stats.all.some((i) => model.gangNodes.get(f.gang).has(i))) {
    t.classList.add("hl-node");
  }
  t.addEventListener("click", () => { location.hash = `g=${encodeURIComponent(g.id)}`; });
  return t;
}

function groupBox(g, f) {
  const box = el("section", `group level-${g.level}`);
  box.dataset.group = g.id;
  box.dataset.level = g.level;
  const head = el("div", "gh", groupTitle(g) + " ");
  head.append(el("span", "muted", statsText(g.stats)));
  box.append(head);
  if (g.stats.nodes > DETAIL_LIMIT) {
    const sums = el("div", "summaries");
    for (const c of g.children) sums.append(summaryTile(c, f));
    if ((g.nodes || []).length) {
      const loose = { id: g.id, level: "nodes", name: "", children: [], nodes: g.nodes };
      loose.stats = { ...g.stats, all: g.nodes };
      const t = el("div", "summary");
      t.append(el("div", "gh", `${g.nodes.length} nodes outside any ${model.levels.join(" / ")}`));
      const heat = el("div", "heat");
      for (const i of g.nodes) heat.append(heatCell(i, f));
      t.append(heat);
      sums.append(t);
    }
    box.append(sums);
    return box;
  }
  for (const c of g.children) box.append(groupBox(c, f));
  if ((g.nodes || []).length) {
    const tiles = el("div", "tiles");
    for (const i of g.nodes) tiles.append(nodeTile(i, f));
    box.append(tiles);
  }
  return box;
}

function crumbs() {
  const nav = $("crumbs");
  nav.textContent = "";
  const chain = [];
  for (let g = model.byId.get(focus); g; g = model.parent.get(g.id)) chain.unshift(g);
  chain.forEach((g, k) => {
    if (k) nav.append(" › ");
    if (k === chain.length - 1) nav.append(el("b", "", groupTitle(g)));
    else {
      const a = el("a", "", groupTitle(g));
      a.addEventListener("click", () => { location.hash = g.id ? `g=${encodeURIComponent(g.id)}` : ""; });
      nav.append(a);
    }
  });
  if (chain.length === 1 && model.root.stats.nodes > DETAIL_LIMIT) {
    nav.append(el("span", "muted", ` (${model.root.stats.nodes} nodes: aggregated; click a group to zoom in)`));
  }
}

function fillSelect(id, values, keep) {
  const s = $(id);
  const cur = s.value;
  while (s.options.length > 1) s.remove(1);
  for (const v of values) s.add(new Option(v, v));
  s.value = values.includes(cur) ? cur : keep;
}

function legend() {
  const lg = $("legend");
  if (lg.childElementCount) return;
  for (const st of model.gpu_states) {
    const s = el("span");
    s.append(el("span", `gpu s-${st}`), STATE_LABEL[st]);
    lg.append(s);
  }
  for (const [cls, text] of [["unhealthy", "unhealthy node"], ["degraded", "degraded node"], ["cordoned", "cordoned node"]]) {
    const s = el("span");
    const box = el("span", `node ${cls}`);
    box.style.width = "18px"; box.style.height = "12px"; box.style.padding = "0";
    s.append(box, text);
    lg.append(s);
  }
}

function render() {
  const f = filters();
  if (!model.byId.has(focus)) focus = "";
  legend();
  crumbs();
  const s = model.root.stats;
  $("cluster").textContent = model.cluster ? `· ${model.cluster}` : "";
  $("stats").textContent = `${s.nodes} nodes · ${s.free}/${s.gpus} GPUs free · ${s.unhealthy} unhealthy · generation ${model.generation}`;
  const view = $("view");
  view.textContent = "";
  view.append(groupBox(model.byId.get(focus), f));
}

function showNode(name) {
  const n = model.nodes[model.nodeIndex.get(name)];
  const p = $("panel");
  p.textContent = "";
  p.append(el("h2", "", n.name));
  p.append(el("div", "", `${n.product || "no GPUs"} · topology ${n.topology}`));
  p.append(el("div", "", `health: ${n.health}${n.cordoned ? ", cordoned" : ""}${n.reasons.length ? ` (${n.reasons.join(", ")})` : ""}`));
  if (n.unmodeled) p.append(el("div", "", `not modelled: ${n.unmodeled}`));
  const ul = el("ul");
  n.gpus.forEach((code, g) => {
    const pi = n.pods[g];
    const who = pi >= 0 ? ` · ${model.pods[pi].key}${model.pods[pi].gang ? ` (gang ${model.pods[pi].gang})` : ""}` : "";
    ul.append(el("li", "", `GPU ${g}: ${STATE_LABEL[stateName(code)]}${who}`));
  });
  p.append(ul);
}

async function showPod(pi) {
  const pod = model.pods[pi];
  const p = $("panel");
  p.textContent = "";
  p.append(el("h2", "", pod.key));
  p.append(el("div", "", `${pod.state} on ${pod.node}, GPUs ${pod.gpus.join(",")}`));
  if (pod.gang) p.append(el("div", "", `gang ${pod.gang} (highlighted)`));
  if (pod.state === "reserved") return;
  const why = el("pre", "", "asking why…");
  p.append(el("h2", "", "why here"), why);
  try {
    const r = await fetch(`v1/inspect/decisions?pod=${encodeURIComponent(pod.key)}&limit=5`, { cache: "no-store" });
    const d = await r.json();
    const lines = (d.decisions || []).map((x) => `[${x.verb}] ${x.summary}`);
    why.textContent = lines.length ? lines.join("\n") : "no decision record held for this pod (placed before this extender started, or evicted from the ring)";
  } catch (e) {
    why.textContent = `could not load the decision records: ${e}`;
  }
}

function onClick(ev) {
  const cell = ev.target.closest(".gpu[data-pod]");
  if (cell && !cell.closest("#legend")) {
    const pod = model.pods[Number(cell.dataset.pod)];
    if (pod.gang) { $("f-gang").value = pod.gang; render(); }
    showPod(Number(cell.dataset.pod));
    return;
  }
  const tile = ev.target.closest(".node[data-node]");
  if (tile) showNode(tile.dataset.node);
}

function onHover(ev) {
  const cell = ev.target.closest(".gpu[data-gang]");
  const gang = cell ? cell.dataset.gang : "";
  if (gang === hoverGang || $("f-gang").value) return;
  hoverGang = gang;
  for (const c of document.querySelectorAll(".gpu.hover")) c.classList.remove("hover");
  if (gang) for (const c of document.querySelectorAll(".gpu[data-gang]")) if (c.dataset.gang === gang) c.classList.add("hover");
}

async function load(force) {
  const t0 = performance.now();
  const r = await fetch("v1/inspect/view", { cache: "no-store" });
  if (!r.ok) throw new Error(`view: HTTP ${r.status}`);
  const m = await r.json();
  const t1 = performance.now();
  if (!force && model && model.generation === m.generation && model.cluster === m.cluster) return;
  model = indexModel(m);
  fillSelect("f-ns", m.namespaces, "");
  fillSelect("f-gang", m.gangs, "");
  fillSelect("f-product", m.products, "");
  render();
  void document.body.offsetHeight;  // include style and layout in the measurement
  await new Promise((res) => requestAnimationFrame(() => setTimeout(res, 0)));
  const t2 = performance.now();
  window.topoplaceView = { nodes: m.nodes.length, generation: m.generation,
    fetchMs: t1 - t0, renderMs: t2 - t1, sinceNavigationMs: t2, elements: document.getElementsByTagName("*").length };
  document.body.dataset.generation = String(m.generation);
}

function fromHash() {
  const h = new URLSearchParams(location.hash.slice(1));
  focus = h.get("g") || "";
}

window.addEventListener("hashchange", () => { fromHash(); if (model) render(); });
for (const id of ["f-ns", "f-gang", "f-product"]) $(id).addEventListener("change", () => render());
$("view").addEventListener("click", onClick);
$("view").addEventListener("mouseover", onHover);
fromHash();
load(true).catch((e) => { $("view").textContent = `could not load the cluster: ${e}`; });
setInterval(() => { if ($("auto").checked) load(false).catch(() => {}); }, REFRESH_MS);
