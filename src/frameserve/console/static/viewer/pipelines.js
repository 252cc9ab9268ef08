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

  var openForm = document.getElementById("open-results");
  if (openForm) {
    openForm.addEventListener("submit", async function (ev) {
      ev.preventDefault();
      var status = document.getElementById("open-status");
      var file = document.getElementById("results-file").files[0];
      if (!file) { status.textContent = "Choose a results file first."; return; }
      status.textContent = "Uploading " + file.name + "…";
      try {
        var doc = await uploadResults(file);
        status.textContent = "Opened: " + doc.frames + " frames.";
        location.assign(doc.url);
      } catch (e) { status.textContent = "Refused: " + e.message; status.classList.add("error"); }
    });
  }

  var tryForm = document.getElementById("try-form");
  if (tryForm) {
    tryForm.addEventListener("submit", async function (ev) {
      ev.preventDefault();
      var status = document.getElementById("try-status");
      var file = document.getElementById("try-file").files[0];
      var params = document.getElementById("try-params").value.trim();
      if (!file) { status.textContent = "Choose a clip first."; return; }
      if (params) { try { JSON.parse(params); } catch (e) { status.textContent = "Parameters are not JSON: " + e.message; return; } }
      var form = new FormData();
      form.append("file", file);
      form.append("pipeline", document.getElementById("try-pipeline").value);
      if (params) form.append("params", params);
      status.textContent = "Analyzing " + file.name + "…";
      try {
        var r = await fetch("/v1/analyze", { method: "POST", body: form, headers: csrfHeaders(), credentials: "same-origin" });
        var text = await r.text();
        if (!r.ok) { var err = {}; try { err = JSON.parse(text); } catch (e) { /* not JSON */ } throw new Error(err.error || ("HTTP " + r.status)); }
        status.textContent = "Analyzed; opening the viewer…";
        var doc = await uploadResults(text);
        location.assign(doc.url);
      } catch (e) { status.textContent = "Failed: " + e.message; status.classList.add("error"); }
    });
  }
})();
