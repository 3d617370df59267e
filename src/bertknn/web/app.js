// The bertknn page: ask /predict, draw the three rankings as bars and the evidence grouped by document.
// Every piece of data goes into the page through textContent, never as HTML.
"use strict";

const $ = (id) => document.getElementById(id);
const RANKINGS = ["bert", "knn", "bert_knn"];

function el(tag, className, text) {
  const node = document.createElement(tag);
  if (className) node.className = className;
  if (text !== undefined) node.textContent = text;
  return node;
}

function formatProbability(p) {
  return p >= 0.001 ? p.toFixed(3) : p.toExponential(0);
}

// FastAPI's `detail` is a string (our errors) or a list of {loc, msg} (request validation).
function describeError(status, body) {
  const detail = body && body.detail;
  if (typeof detail === "string") return detail;
  if (Array.isArray(detail)) {
    return detail.map((d) => `${(d.loc || []).filter((p) => p !== "body").join(".")}: ${d.msg}`).join("\n");
  }
  return `the server answered ${status}`;
}

async function callApi(path, options) {
  let response;
  try {
    response = await fetch(path, options);
  } catch (err) {
    throw new Error(`cannot reach the server (${err.message})`);
  }
  let body = null;
  try {
    body = await response.json();
  } catch {
    body = null;
  }
  if (!response.ok) throw new Error(describeError(`${response.status} ${response.statusText}`, body));
  if (body === null) throw new Error(`the server answered ${response.status} without JSON`);
  return body;
}

function showError(message) {
  const box = $("error");
  box.textContent = `Error: ${message}`;
  box.hidden = false;
}

function clearError() {
  $("error").hidden = true;
  $("error").textContent = "";
}

function drawRanking(name, scores) {
  const list = $(`ranking-${name}`).querySelector("ol");
  list.replaceChildren();
  if (!scores.length) {
    list.append(el("li", "empty", name === "knn" ? "no neighbours (nothing retrieved)" : "no answers"));
    return;
  }
  for (const { token, probability } of scores) {
    const item = el("li");
    const track = el("div", "track");
    const bar = el("div", "bar");
    bar.style.width = `${Math.min(100, probability * 100)}%`;
    track.append(bar);
    item.append(el("span", "token", token), track, el("span", "prob", formatProbability(probability)));
    item.title = `${token}: ${probability}`;
    list.append(item);
  }
}

// A sentence with its neighbours' words in <mark>; spans count Unicode code points, as Python does.
// The marks of the top kNN answer stand out.
function highlighted(sentence, neighbours, topToken) {
  const chars = Array.from(sentence);
  const line = el("span", "sentence");
  let at = 0;
  for (const n of [...neighbours].sort((a, b) => a.span[0] - b.span[0])) {
    const [start, end] = n.span;
    if (start < at) continue; // overlapping spans cannot come from one tokenization; keep the page sane anyway
    line.append(document.createTextNode(chars.slice(at, start).join("")));
    const mark = el("mark", n.token === topToken ? "top" : "", chars.slice(start, end).join(""));
    mark.title = `${n.token}: squared distance ${n.distance.toFixed(2)}, weight ${n.weight.toPrecision(3)}`;
    line.append(mark);
    at = end;
  }
  line.append(document.createTextNode(chars.slice(at).join("")));
  return line;
}

// Groups of [key, items] in order of each group's nearest neighbour.
function groupBy(neighbours, key) {
  const groups = new Map();
  for (const n of neighbours) {
    if (!groups.has(key(n))) groups.set(key(n), []);
    groups.get(key(n)).push(n);
  }
  const best = (items) => Math.min(...items.map((n) => n.distance));
  return [...groups.entries()].sort((a, b) => best(a[1]) - best(b[1]));
}

// Evidence grouped by document, then by sentence: each sentence once, every neighbour's word in it marked.
function drawEvidence(evidence, topToken) {
  const box = $("evidence");
  box.replaceChildren();
  const neighbours = Object.values(evidence).flat();
  if (!neighbours.length) {
    box.append(el("p", "muted", "No evidence: no stored context was near the question."));
    return;
  }
  for (const [title, inDocument] of groupBy(neighbours, (n) => n.title)) {
    const doc = el("div", "doc");
    doc.append(el("h3", "", title));
    const list = el("ul");
    for (const [sentence, inSentence] of groupBy(inDocument, (n) => n.sentence)) {
      const words = [...inSentence].sort((a, b) => a.distance - b.distance);
      const item = el("li");
      item.append(
        highlighted(sentence, inSentence, topToken),
        el("span", "meta", words.map((n) => `${n.token} d² ${n.distance.toFixed(2)}${n.count > 1 ? ` ×${n.count}` : ""}`).join(" · ")),
      );
      list.append(item);
    }
    doc.append(list);
    box.append(doc);
  }
}

function drawPrediction(p) {
  const docs = p.documents.length ? p.documents.join(", ") : "none (BERT alone answers)";
  $("documents").textContent = `Documents searched: ${docs}`;
  const found = p.linked;  // asked without a subject: the one the question names
  $("linked").textContent = found ? `Subject: ${found.subject} (found in the question: "${found.text}", ${found.by})` : "";
  $("linked").hidden = !found;
  for (const name of RANKINGS) drawRanking(name, p[name]);
  drawEvidence(p.evidence, p.knn.length ? p.knn[0].token : null);
  $("result").hidden = false;
}

async function ask(event) {
  if (event) event.preventDefault();
  clearError();
  const text = $("question").value.trim();
  const subject = $("subject").value.trim();
  const button = $("ask");
  button.disabled = true;
  button.textContent = "Asking…";
  try {
    const prediction = await callApi("/predict", {
      method: "POST",
      headers: { "Content-Type": "application/json" },
      body: JSON.stringify({ text, subject: subject || null, top_k: 10, evidence: 3 }),
    });
    drawPrediction(prediction);
  } catch (err) {
    $("result").hidden = true;
    showError(err.message);
  } finally {
    button.disabled = false;
    button.textContent = "Ask";
  }
}

async function loadExamples() {
  const box = $("examples");
  try {
    for (const example of await callApi("/examples")) {
      const button = el("button", "example", example.question);
      button.type = "button";
      button.addEventListener("click", () => {
        $("question").value = example.question;
        $("subject").value = example.subject || "";
        ask();
      });
      box.append(button);
    }
  } catch (err) {
    showError(`could not load the example questions: ${err.message}`);
  }
}

async function loadStatus() {
  try {
    const h = await callApi("/health");
    $("status").textContent =
      `Model ${h.model} (layer ${h.layer}) · ${h.documents.toLocaleString()} documents · ` +
      `${h.contexts.toLocaleString()} stored contexts · λ ${h.hparams.lam}, k ${h.hparams.k}, ${h.hparams.n_docs} documents per question`;
  } catch {
    // the introduction stays; a failed /health is not worth an error box
  }
}

document.addEventListener("DOMContentLoaded", () => {
  $("ask-form").addEventListener("submit", ask);
  loadExamples();
  loadStatus();
});
