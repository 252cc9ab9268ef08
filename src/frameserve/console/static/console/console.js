// frameserve console: shared helpers (no inline script: strict CSP).
"use strict";
window.frameserve = {
  csrf() { const m = document.querySelector('meta[name="csrf-token"]'); return m ? m.content : ""; },
  // fetch JSON with the session's CSRF token; resolves to {ok, status, body}
  async send(method, url, body) {
    const init = { method, headers: { "X-CSRF-Token": this.csrf() }, credentials: "same-origin" };
    if (body !== undefined) { init.headers["Content-Type"] = "application/json"; init.body = JSON.stringify(body); }
    const r = await fetch(url, init);
    let doc = null;
    try { doc = await r.json(); } catch (e) { doc = null; }
    return { ok: r.ok, status: r.status, body: doc };
  },
};
