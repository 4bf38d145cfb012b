// The /ui page: plain JavaScript over the gateway's public API (same origin), no framework, no build step.
"use strict";

const $ = (id) => document.getElementById(id);
const API_ROOT = new URL("..", window.location.href);  // the gateway, wherever it is mounted

// ---- the API: every error shown is the API's own message ({"error": {"message": ...}})
class ApiError extends Error {}

function headers() {
  const h = { "Content-Type": "application/json" };
  const key = $("api-key").value.trim();
  if (key) h.Authorization = `Bearer ${key}`;
  return h;
}

async function errorMessage(response) {
  const text = await response.text();
  try {
    const body = JSON.parse(text);
    if (body && body.error && body.error.message) return body.error.message;
    if (body && body.detail) return typeof body.detail === "string" ? body.detail : JSON.stringify(body.detail);
  } catch (_) { /* not JSON */ }
  return text || `${response.status} ${response.statusText}`;
}

async function call(method, path, body) {
  const response = await fetch(new URL(path, API_ROOT), {
    method, headers: headers(), body: body === undefined ? undefined : JSON.stringify(body),
  });
  if (!response.ok) throw new ApiError(await errorMessage(response));
  return response.json();
}

// Runs `work` with the panel's button disabled and its error line cleared, then shows any error there.
async function guarded(errorId, button, work) {
  $(errorId).textContent = "";
  if (button) button.disabled = true;
  try {
    await work();
  } catch (err) {
    $(errorId).textContent = err instanceof ApiError ? err.message : `Could not reach the gateway: ${err.message}`;
  } finally {
    if (button) button.disabled = false;
  }
}

// ---- files
function dataUrl(file) {
  return new Promise((resolve, reject) => {
    const reader = new FileReader();
    reader.onload = () => resolve(reader.result);
    reader.onerror = () => reject(reader.error);
    reader.readAsDataURL(file);
  });
}

async function thumbnail(file, size = 160) {
  try {
    const bitmap = await createImageBitmap(file);
    const scale = Math.min(1, size / Math.max(bitmap.width, bitmap.height));
    const canvas = document.createElement("canvas");
    canvas.width = Math.max(1, Math.round(bitmap.width * scale));
    canvas.height = Math.max(1, Math.round(bitmap.height * scale));
    canvas.getContext("2d").drawImage(bitmap, 0, 0, canvas.width, canvas.height);
    return canvas.toDataURL("image/jpeg", 0.8);
  } catch (_) {
    return "";  // not an image the browser decodes: the gateway's answer will say why
  }
}

function pointId(name) {
  const stem = name.replace(/\.[^.]*$/, "") || "image";
  return stem.replace(/[^A-Za-z0-9_-]/g, "_").slice(0, 128);
}

const isImage = (f) => f.type.startsWith("image/") || /\.(jpe?g|png|webp|bmp|gif)$/i.test(f.name);

// The files of a drop, folders walked (a dropped folder's entries are read through the entries API).
async function droppedFiles(transfer) {
  const entries = [...(transfer.items || [])].map((i) => i.webkitGetAsEntry && i.webkitGetAsEntry()).filter(Boolean);
  if (!entries.length || entries.every((entry) => entry.isFile)) return [...transfer.files];
  const files = [];
  async function walk(entry) {
    if (entry.isFile) {
      files.push(await new Promise((resolve, reject) => entry.file(resolve, reject)));
    } else if (entry.isDirectory) {
      const reader = entry.createReader();
      for (;;) {  // readEntries answers in pages until an empty one
        const page = await new Promise((resolve, reject) => reader.readEntries(resolve, reject));
        if (!page.length) break;
        for (const child of page) await walk(child);
      }
    }
  }
  for (const entry of entries) await walk(entry);
  return files;
}

// A drop zone: drag and drop, or its file input (reachable by keyboard: Enter / Space on the zone).
function dropZone(zoneId, inputId, onFiles, extraInputs = []) {
  const zone = $(zoneId), input = $(inputId);
  zone.addEventListener("dragover", (e) => { e.preventDefault(); zone.classList.add("over"); });
  zone.addEventListener("dragleave", () => zone.classList.remove("over"));
  zone.addEventListener("drop", async (e) => {
    e.preventDefault();
    zone.classList.remove("over");
    const files = (await droppedFiles(e.dataTransfer)).filter(isImage);
    if (files.length) onFiles(files);
  });
  zone.addEventListener("keydown", (e) => {
    if (e.key === "Enter" || e.key === " ") { e.preventDefault(); input.click(); }
  });
  for (const picker of [input, ...extraInputs.map($)]) {
    picker.addEventListener("change", () => {
      const files = [...picker.files].filter(isImage);
      if (files.length) onFiles(files);
      picker.value = "";
    });
  }
}

// ---- image search
const INDEX_BATCH = 16;

async function ensureCollection() {
  const name = $("collection").value.trim(), model = $("clip-model").value.trim();
  await call("POST", "load_clip_model", { model_name: model });  // "already loaded" when it is
  await call("PUT", `collections/${encodeURIComponent(name)}`, { model });
  return name;
}

async function indexFiles(files) {
  await guarded("search-error", null, async () => {
    const status = $("index-status");
    status.textContent = `Indexing ${files.length} image(s)…`;
    const name = await ensureCollection();
    let done = 0, count = 0;
    for (let i = 0; i < files.length; i += INDEX_BATCH) {
      const batch = files.slice(i, i + INDEX_BATCH);
      const points = await Promise.all(batch.map(async (file) => ({
        id: pointId(file.name), image: await dataUrl(file),
        payload: { name: file.name, thumb: await thumbnail(file) },
      })));
      count = (await call("POST", `collections/${encodeURIComponent(name)}/points`, { points })).count;
      done += batch.length;
      status.textContent = `Indexed ${done} of ${files.length}; the collection holds ${count}`;
    }
  });
}

function showResults(results) {
  const list = $("results");
  list.replaceChildren();
  if (!results.length) {
    const li = document.createElement("li");
    li.textContent = "No results";
    list.append(li);
    return;
  }
  for (const hit of results) {
    const li = document.createElement("li");
    const img = document.createElement("img");
    img.alt = hit.payload && hit.payload.name ? hit.payload.name : hit.id;
    if (hit.payload && hit.payload.thumb) img.src = hit.payload.thumb;
    const meta = document.createElement("div");
    meta.className = "meta";
    const id = document.createElement("span");
    id.className = "id";
    id.textContent = hit.id;
    const score = document.createElement("span");
    score.className = "score";
    score.textContent = hit.score.toFixed(3);
    meta.append(id, score);
    li.append(img, meta);
    list.append(li);
  }
}

async function search(query, button) {
  await guarded("search-error", button, async () => {
    const name = $("collection").value.trim();
    const limit = Number($("search-limit").value);  // the API bounds it (SEARCH_MAX_LIMIT) and says so
    const answer = await call("POST", `collections/${encodeURIComponent(name)}/search`, { ...query, limit });
    showResults(answer.results);
  });
}

// ---- NER: the text with each entity marked (offsets are code points, as Python counts them)
function showEntities(text, entities) {
  const out = $("ner-output"), chars = Array.from(text);
  out.replaceChildren();
  let at = 0;
  for (const e of [...entities].sort((a, b) => a.start - b.start)) {
    if (e.start < at) continue;
    out.append(chars.slice(at, e.start).join(""));
    const mark = document.createElement("mark");
    mark.dataset.label = e.label;
    mark.title = `${e.label} ${e.score.toFixed(2)}`;
    mark.textContent = chars.slice(e.start, e.end).join("");
    out.append(mark);
    at = e.end;
  }
  out.append(chars.slice(at).join(""));
  const table = $("ner-table"), body = table.tBodies[0];
  body.replaceChildren();
  for (const e of entities) {
    const row = body.insertRow();
    for (const value of [e.text, e.label, e.score.toFixed(3)]) row.insertCell().textContent = value;
  }
  table.hidden = entities.length === 0;
  if (!entities.length) out.append(document.createTextNode("  (no entities)"));
}

// ---- caption
async function captionFile(file) {
  await guarded("caption-error", null, async () => {
    const image = await dataUrl(file);
    $("caption-preview").src = image;
    $("caption-figure").hidden = true;
    const answer = await call("POST", "v1/caption", { image });
    $("caption-text").textContent = answer.caption;
    $("caption-label").textContent = answer.label;
    $("caption-score").textContent = answer.score.toFixed(3);
    $("caption-figure").hidden = false;
  });
}

// ---- streamed completion: server-sent events read from the response body as they arrive
async function complete(button) {
  await guarded("complete-error", button, async () => {
    const prompt = $("prompt").value;
    $("completion-prompt").textContent = prompt;
    $("completion-text").textContent = "";
    $("complete-status").textContent = "streaming…";
    const response = await fetch(new URL("v1/completions", API_ROOT), {
      method: "POST", headers: headers(),
      body: JSON.stringify({ model: "codegen", prompt, max_tokens: Number($("max-tokens").value) || 48,
                             temperature: 0, stream: true }),
    });
    if (!response.ok) throw new ApiError(await errorMessage(response));
    const reader = response.body.getReader(), decoder = new TextDecoder();
    let buffer = "", finish = "", events = 0;
    for (;;) {
      const { value, done } = await reader.read();
      if (done) break;
      buffer += decoder.decode(value, { stream: true });
      let cut;
      while ((cut = buffer.indexOf("\n\n")) >= 0) {
        const event = buffer.slice(0, cut);
        buffer = buffer.slice(cut + 2);
        for (const line of event.split("\n")) {
          if (!line.startsWith("data: ")) continue;
          const data = line.slice(6);
          if (data === "[DONE]") continue;
          const chunk = JSON.parse(data);
          if (chunk.error) throw new ApiError(chunk.error.message);
          for (const choice of chunk.choices || []) {
            $("completion-text").dataset.events = ++events;  // each event is shown as it arrives
            $("completion-text").textContent += choice.text;
            if (choice.finish_reason) finish = choice.finish_reason;
          }
        }
      }
    }
    $("complete-status").textContent = finish ? `finished: ${finish}` : "finished";
  });
  if ($("complete-error").textContent) $("complete-status").textContent = "";
}

// ---- embedding comparison: both vectors are L2-normalized, so their dot product is the cosine
async function compare(button) {
  await guarded("compare-error", button, async () => {
    $("similarity").textContent = "";
    const answer = await call("POST", "v1/embeddings", {
      model: $("embed-model").value.trim(), input: [$("sentence-a").value, $("sentence-b").value],
      encoding_format: "float",
    });
    const [a, b] = answer.data.map((d) => d.embedding);
    const cosine = a.reduce((sum, v, i) => sum + v * b[i], 0);
    $("similarity").textContent = `cosine similarity ${cosine.toFixed(4)}`;
    $("similarity").dataset.cosine = String(cosine);
  });
}

// ---- wiring
function submitter(formId, run) {
  $(formId).addEventListener("submit", (e) => {
    e.preventDefault();
    run(e.submitter || $(formId).querySelector("button"));
  });
}

$("api-key").value = sessionStorage.getItem("apiKey") || "";
$("api-key").addEventListener("change", () => sessionStorage.setItem("apiKey", $("api-key").value.trim()));
$("key-form").addEventListener("submit", (e) => e.preventDefault());
dropZone("index-drop", "index-files", indexFiles, ["index-folder"]);
dropZone("query-drop", "query-file", async (files) => search({ image: await dataUrl(files[0]) }, null));
dropZone("caption-drop", "caption-file", (files) => captionFile(files[0]));
submitter("search-form", (button) => search({ text: $("search-text").value }, button));
submitter("ner-form", (button) => guarded("ner-error", button, async () => {
  const text = $("ner-text").value;
  const answer = await call("POST", "v1/ner", { text });
  showEntities(text, answer.entities);
}));
submitter("complete-form", complete);
submitter("compare-form", compare);

// ---- the demo pipelines `make triton` still builds behind the server (GET /health's `builds`, issue 57)
function buildLine(name, build) {
  if (build.state === "failed") return `${name}: failed (${build.error || "see the build log"})`;
  let line = `${name}: ${build.phase || "waiting"}`;
  if (build.progress) line += ` ${build.progress.percent}%`;
  if (build.eta_s !== undefined) line += `, about ${build.eta_s} s left`;
  return line;
}

async function showBuilds() {
  let builds = {};
  try {
    const response = await fetch(new URL("health", API_ROOT));
    builds = (await response.json()).builds || {};
  } catch (_) { /* the gateway restarting: try again later */ }
  const pending = Object.entries(builds).filter(([, b]) => b.state !== "ready");
  const line = $("builds");
  line.hidden = pending.length === 0;
  line.textContent = pending.length ? "Not ready yet: " + pending.map(([n, b]) => buildLine(n, b)).join("; ") : "";
  if (pending.some(([, b]) => b.state === "building")) setTimeout(showBuilds, 5000);
}
showBuilds();
