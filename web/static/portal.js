// Allot portal: send forms and buttons to the JSON API with the session's CSRF token, and
// show the API's field errors next to the fields they name. No dependencies.
"use strict";

function csrf() {
  const m = document.querySelector('meta[name="csrf-token"]');
  return m ? m.content : "";
}

async function call(method, url, body) {
  const headers = { "x-csrf-token": csrf(), accept: "application/json" };
  if (body !== undefined) headers["content-type"] = "application/json";
  const res = await fetch(url, {
    method, headers, credentials: "same-origin",
    body: body === undefined ? undefined : JSON.stringify(body),
  });
  let data = null;
  const text = await res.text();
  try { data = text ? JSON.parse(text) : null; } catch (_) { data = { detail: text }; }
  return { ok: res.ok, status: res.status, data };
}

// "0.25" -> 250, "2" -> 2000: the milli of a GPU count.
function milli(v) {
  const n = Number(v);
  return Number.isFinite(n) ? Math.round(n * 1000) : NaN;
}

// A time limit as people write it, in seconds: 90m, 2h, 1d12h, 45s, or [D-]HH:MM:SS;
// 0 when it is none of these.
function timeLimit(v) {
  const clock = /^(?:(\d+)-)?(\d+):(\d{1,2}):(\d{1,2})$/.exec(v);
  if (clock) {
    const [, d, h, m, s] = clock.map((x) => Number(x || 0));
    return m < 60 && s < 60 ? d * 86400 + h * 3600 + m * 60 + s : 0;
  }
  const units = { d: 86400, h: 3600, m: 60, s: 1 };
  let total = 0;
  const re = /(\d+)([dhms])/gy;
  let match;
  let at = 0;
  while ((match = re.exec(v)) !== null) {
    total += Number(match[1]) * units[match[2]];
    at = re.lastIndex;
  }
  return at === v.length ? total : 0;
}

// What a form's body is instead when a field is wrong before anything is sent: shown as
// the API's field errors are.
function refused(field, reason) {
  return { refused: { title: "Invalid request", errors: [{ field, reason }] } };
}

// The request body of each kind of form, from its fields.
const bodies = {
  job(f) {
    const v = (n) => (f.elements[n] ? f.elements[n].value.trim() : "");
    const body = { tenant: v("tenant"), command: ["sh", "-c", v("command")] };
    if (v("name")) body.name = v("name");
    else if (v("command")) body.name = v("command").split(/\s+/)[0].split("/").pop().slice(0, 128);
    const mig = v("mig_profile");
    if (mig) {
      body.mig_profile = mig;
    } else {
      const m = milli(v("gpus") || "0");
      if (Number.isNaN(m) || m < 0) {
        return refused("gpus", `\`${v("gpus")}\` is not a number of GPUs: write e.g. 2, or 0.5 for half of one`);
      } else if (m > 0 && m < 1000) { body.gpus = 1; body.gpu_milli = m; }
      else if (m % 1000 !== 0) {
        return refused("gpus", `${v("gpus")} GPUs cannot be held: ask for whole GPUs (1, 2, …) or a share of one GPU (e.g. 0.5)`);
      } else { body.gpus = m / 1000; }
    }
    if (v("gpu_memory")) body.gpu_memory_bytes = Math.round(Number(v("gpu_memory")) * 1024 ** 3);
    if (v("gpu_models")) body.gpu_models = v("gpu_models").split(",").map((s) => s.trim()).filter(Boolean);
    if (v("priority")) body.priority = Number(v("priority"));
    if (v("cpus")) {
      const c = milli(v("cpus"));
      if (Number.isNaN(c) || c < 0) return refused("cpu_milli", `\`${v("cpus")}\` is not a number of CPUs: write e.g. 4, or 0.5`);
      body.cpu_milli = c;
    }
    if (v("memory")) {
      const g = Number(v("memory"));
      if (!Number.isFinite(g) || g < 0) return refused("memory_bytes", `\`${v("memory")}\` is not a size in GiB`);
      body.memory_bytes = Math.round(g * 1024 ** 3);
    }
    if (v("time_limit")) {
      const secs = timeLimit(v("time_limit"));
      if (!secs) return refused("time_limit_secs", `\`${v("time_limit")}\` is not a time limit: write 90m, 2h, 1d12h or HH:MM:SS`);
      body.time_limit_secs = secs;
    }
    if (v("replicas")) {
      const r = Number(v("replicas"));
      if (!Number.isInteger(r) || r < 1) return refused("replicas", "a whole number from 1");
      body.replicas = r;
    }
    if (v("array")) body.array = v("array");
    if (v("image")) body.image = v("image");
    if (v("env")) {
      body.env = {};
      for (const line of v("env").split("\n").map((l) => l.trim()).filter(Boolean)) {
        const eq = line.indexOf("=");
        if (eq < 1) return refused("env", `\`${line}\`: write KEY=VALUE`);
        body.env[line.slice(0, eq)] = line.slice(eq + 1);
      }
    }
    if (!v("command")) body.command = [];
    return body;
  },
  tenant(f) {
    const v = (n) => f.elements[n].value.trim();
    const body = { name: v("name"), quota: { guaranteed: { gpu_milli: milli(v("guaranteed_gpus") || "0") }, limit: {} } };
    if (v("parent")) body.parent = v("parent");
    if (v("max_gpus")) body.quota.limit.gpu_milli = milli(v("max_gpus"));
    return body;
  },
  binding(f) {
    const v = (n) => f.elements[n].value.trim();
    const body = { claim: v("claim"), value: v("value"), role: v("role") };
    if (v("tenant")) body.tenant = v("tenant");
    return body;
  },
  // A merge patch of what the form shows: an emptied limit or budget is lifted (null).
  quota(f) {
    const v = (n) => f.elements[n].value.trim();
    return {
      guaranteed: { gpu_milli: milli(v("guaranteed_gpus") || "0") },
      limit: { gpu_milli: v("max_gpus") ? milli(v("max_gpus")) : null },
      weight: Number(v("weight") || "1"),
      gpu_hour_budget: v("budget") ? Number(v("budget")) : null,
    };
  },
  token(f) {
    const v = (n) => f.elements[n].value.trim();
    const body = { name: v("name"), role: v("role") };
    if (v("tenant")) body.tenant = v("tenant");
    return body;
  },
};

function clearErrors(form) {
  form.querySelectorAll(".error").forEach((e) => { e.textContent = ""; });
  form.querySelectorAll("[aria-invalid]").forEach((e) => e.removeAttribute("aria-invalid"));
  const alert = form.querySelector(".alert");
  if (alert) { alert.hidden = true; alert.textContent = ""; }
}

function showProblem(form, problem) {
  const alert = form.querySelector(".alert");
  const errors = (problem && problem.errors) || [];
  let unplaced = [];
  for (const e of errors) {
    const slot = form.querySelector(`.error[data-for="${CSS.escape(e.field)}"]`);
    if (slot) {
      slot.textContent = e.reason;
      const input = slot.previousElementSibling;
      if (input && input.matches("input, select, textarea")) input.setAttribute("aria-invalid", "true");
    } else {
      unplaced.push(`${e.field}: ${e.reason}`);
    }
  }
  if (alert) {
    const detail = (problem && (problem.detail || problem.title)) || "The request was refused.";
    alert.textContent = errors.length ? `Please correct the fields below. ${unplaced.join("; ")}` : detail;
    alert.hidden = false;
    alert.focus && alert.focus();
  }
}

document.addEventListener("submit", async (ev) => {
  const form = ev.target;
  if (!form.matches("form[data-api]")) return;
  ev.preventDefault();
  clearErrors(form);
  const body = bodies[form.dataset.kind](form);
  if (body.refused) { showProblem(form, body.refused); return; }
  const button = form.querySelector('button[type="submit"]');
  if (button) button.disabled = true;
  try {
    // `{field}` in the address is filled from the form (e.g. the tenant whose quota it sets).
  const url = form.dataset.api.replace(/\{(\w+)\}/g, (_, n) => encodeURIComponent(form.elements[n].value.trim()));
  const r = await call(form.dataset.method || "POST", url, body);
    if (!r.ok) { showProblem(form, r.data); return; }
    const then = form.dataset.then;
    if (then === "job") { window.location.assign(`/portal/jobs/${r.data.id}`); }
    else if (then === "secret") {
      const p = form.querySelector(".secret");
      p.querySelector("code").textContent = r.data.secret;
      p.hidden = false;
    } else { window.location.reload(); }
  } catch (e) {
    showProblem(form, { detail: `The control plane could not be reached (${e}).` });
  } finally {
    if (button) button.disabled = false;
  }
});

// Asks before an action that stops or takes away something (its button's data-confirm says
// what): true when confirmed. Escape or "Keep it as it is" is no.
function confirmed(text) {
  const d = document.getElementById("confirm");
  if (!d || typeof d.showModal !== "function") return Promise.resolve(window.confirm(text));
  d.querySelector("#confirm-text").textContent = text;
  d.returnValue = "";
  return new Promise((resolve) => {
    d.addEventListener("close", () => resolve(d.returnValue === "yes"), { once: true });
    d.showModal();
  });
}

document.addEventListener("click", async (ev) => {
  const b = ev.target.closest("button[data-post]");
  if (!b) return;
  if (b.dataset.confirm && !(await confirmed(b.dataset.confirm))) return;
  b.disabled = true;
  const method = b.dataset.method || "POST";
  const r = await call(method, b.dataset.post, method === "DELETE" ? undefined : {});
  const then = b.dataset.then;
  if (!r.ok && r.status !== 303) {
    window.alert((r.data && (r.data.detail || r.data.title)) || `Refused (${r.status}).`);
    b.disabled = false;
    return;
  }
  if (then === "reload") window.location.reload();
  else window.location.assign(then || "/portal");
});

// The quota form starts from the chosen tenant's current quota.
function fillQuota(select) {
  const o = select.selectedOptions[0];
  if (!o) return;
  const f = select.form;
  f.elements.guaranteed_gpus.value = o.dataset.guaranteed || "0";
  f.elements.max_gpus.value = o.dataset.limit || "";
  f.elements.weight.value = o.dataset.weight || "1";
  f.elements.budget.value = o.dataset.budget || "";
}
document.addEventListener("change", (ev) => {
  if (ev.target.matches && ev.target.matches("#q-tenant")) fillQuota(ev.target);
});
document.querySelectorAll("#q-tenant").forEach(fillQuota);

// A job that has not ended: its log grows in place as the job writes it, and the page is
// reloaded when the job's state or attempt changes (never while a question is open).
const LOG_KEEP_CHARS = 1 << 20;
async function followLog(pre) {
  const res = await fetch(pre.dataset.follow, { credentials: "same-origin" });
  if (!res.ok || !res.body) return;
  const reader = res.body.getReader();
  const text = new TextDecoder();
  for (;;) {
    const { done, value } = await reader.read();
    if (done) break;
    const atBottom = pre.scrollHeight - pre.scrollTop - pre.clientHeight < 20;
    pre.textContent += text.decode(value, { stream: true });
    if (pre.textContent.length > LOG_KEEP_CHARS) pre.textContent = pre.textContent.slice(-LOG_KEEP_CHARS);
    const empty = document.getElementById("log-empty");
    if (empty) empty.remove();
    if (atBottom) pre.scrollTop = pre.scrollHeight;
  }
}
document.querySelectorAll("pre[data-follow]").forEach((pre) => { followLog(pre).catch(() => {}); });

const job = document.getElementById("job");
if (job && document.querySelector("pre[data-follow]")) {
  setInterval(async () => {
    if (document.querySelector("dialog[open]")) return;
    const r = await call("GET", job.dataset.job).catch(() => null);
    if (!r || !r.ok || !r.data) return;
    if (r.data.state !== job.dataset.state || String(r.data.attempt) !== job.dataset.attempt) {
      window.location.reload();
    }
  }, 2000);
}

// A node's chart, fetched when its details are first opened (a page of nodes carries
// none of them until asked).
async function loadChart(details) {
  const slot = details.querySelector(".chart-slot[data-chart]");
  if (!slot || slot.dataset.loaded) return;
  slot.dataset.loaded = "1";
  try {
    const r = await fetch(slot.dataset.chart, { credentials: "same-origin" });
    if (!r.ok) throw new Error(r.status);
    const doc = new DOMParser().parseFromString(await r.text(), "text/html");
    slot.replaceChildren(...doc.body.childNodes);
  } catch (e) {
    slot.textContent = "The chart could not be loaded.";
    delete slot.dataset.loaded;
  }
}
for (const d of document.querySelectorAll("details.node")) {
  d.addEventListener("toggle", () => { if (d.open) loadChart(d); });
  if (d.open) loadChart(d);
}

// A node's details opened when a link (the heatmap's) points at them.
function openTarget() {
  const id = decodeURIComponent(window.location.hash.slice(1));
  const d = id && document.getElementById(id);
  if (d && d.tagName === "DETAILS") d.open = true;
}
window.addEventListener("hashchange", openTarget);
openTarget();
