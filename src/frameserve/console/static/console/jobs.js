// The Jobs page: live rows over Server-Sent Events, the submit form, cancel / retry / delete.
"use strict";
(function () {
  const table = document.getElementById("jobs");
  if (!table) return;
  const status = document.getElementById("status");
  const say = (text) => { status.textContent = text; };
  const api = "/console/api/v1/jobs";

  // the actions a job's state allows (the job API's: cancel a live job, retry or delete a finished one)
  const ALLOWED = { cancel: ["queued", "running"], retry: ["failed", "cancelled"],
                    delete: ["succeeded", "failed", "cancelled"] };

  function update(row) {
    const tr = table.querySelector('tr[data-id="' + CSS.escape(row.id) + '"]');
    if (!tr) return false;
    const st = tr.querySelector(".state");
    st.textContent = row.state; st.className = "state state-" + row.state;
    tr.querySelector(".phase").textContent = row.phase || "";
    tr.querySelector(".progress").value = row.progress;
    tr.querySelector(".pct").textContent = row.progress + " %";
    tr.querySelector(".fps").textContent = row.fps == null ? "" : row.fps.toFixed(1);
    tr.querySelector(".attempts").textContent = row.attempts + "/" + row.max_attempts;
    for (const b of tr.querySelectorAll("button[data-act]")) b.hidden = !ALLOWED[b.dataset.act].includes(row.state);
    return true;
  }

  const source = new EventSource(table.dataset.stream);
  source.addEventListener("jobs", (ev) => {
    let rows;
    try { rows = JSON.parse(ev.data); } catch (e) { return; }
    let missing = false;
    for (const row of rows) { if (!update(row)) missing = true; }
    if (missing) say("New jobs: reload the page to list them.");
  });
  window.addEventListener("beforeunload", () => source.close());

  table.addEventListener("click", async (ev) => {
    const button = ev.target.closest("button[data-act]");
    if (!button) return;
    const id = button.closest("tr").dataset.id;
    const act = button.dataset.act;
    const r = act === "delete" ? await frameserve.send("DELETE", api + "/" + encodeURIComponent(id))
                               : await frameserve.send("POST", api + "/" + encodeURIComponent(id) + "/" + act);
    if (r.ok && act === "delete") button.closest("tr").remove();
    say(r.ok ? act + " " + id + ": done" : act + " " + id + ": " + (r.body && r.body.error || r.status));
  });

  const form = document.getElementById("submit");
  if (form) form.addEventListener("submit", async (ev) => {
    ev.preventDefault();
    let params;
    try { params = JSON.parse(form.params.value || "{}"); } catch (e) { say("Params must be a JSON object"); return; }
    const r = await frameserve.send("POST", api, { source: form.source.value, target: form.target.value,
                                                  pipeline: form.pipeline.value, params });
    if (r.ok) { window.location.reload(); } else { say("submit: " + (r.body && r.body.error || r.status)); }
  });
})();
