// The Pipelines page's try-form (a clip through /v1/analyze, then the results into the viewer)
// and the "Open results" form. No inline script: the pages' CSP allows only this server's files.
"use strict";
(function () {
  function csrfHeaders() {
    var m = document.querySelector('meta[name="csrf-token"]');
    return m ? { "X-CSRF-Token": m.content } : {};
  }
  async function uploadResults(body) {
    var headers = Object.assign({ "Content-Type": "application/json" }, csrfHeaders());
    var r = await fetch("/console/api/results", { method: "POST", body: body, headers: headers, credentials: "same-origin" });
    var doc = await r.json();
    if (!r.ok) throw new Error(doc.error || ("HTTP " + r.status));
    return doc;
  }
  window.frameserveUploadResults = uploadResults;

  // a form with one file input: submit checks that a file was chosen, runs run(file, status) and
  // shows what failed, prefixed with `failed`, in the status line
  function onFileForm(formId, statusId, fileId, missing, failed, run) {
    var form = document.getElementById(formId);
    if (!form) return;
    form.addEventListener("submit", async function (ev) {
      ev.preventDefault();
      var status = document.getElementById(statusId);
      var file = document.getElementById(fileId).files[0];
      if (!file) { status.textContent = missing; return; }
      try { await run(file, status); } catch (e) { status.textContent = failed + e.message; status.classList.add("error"); }
    });
  }

  onFileForm("open-results", "open-status", "results-file", "Choose a results file first.", "Refused: ", async function (file, status) {
    status.textContent = "Uploading " + file.name + "…";
    var doc = await uploadResults(file);
    status.textContent = "Opened: " + doc.frames + " frames.";
    location.assign(doc.url);
  });

  onFileForm("try-form", "try-status", "try-file", "Choose a clip first.", "Failed: ", async function (file, status) {
    var params = document.getElementById("try-params").value.trim();
    if (params) { try { JSON.parse(params); } catch (e) { status.textContent = "Parameters are not JSON: " + e.message; return; } }
    var form = new FormData();
    form.append("file", file);
    form.append("pipeline", document.getElementById("try-pipeline").value);
    if (params) form.append("params", params);
    status.textContent = "Analyzing " + file.name + "…";
    var r = await fetch("/v1/analyze", { method: "POST", body: form, headers: csrfHeaders(), credentials: "same-origin" });
    var text = await r.text();
    if (!r.ok) { var err = {}; try { err = JSON.parse(text); } catch (e) { /* not JSON */ } throw new Error(err.error || ("HTTP " + r.status)); }
    status.textContent = "Analyzed; opening the viewer…";
    var doc = await uploadResults(text);
    location.assign(doc.url);
  });
})();
