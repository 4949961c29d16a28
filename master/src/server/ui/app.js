// Gantry dashboard, live part: follows /api/v1/events (server-sent events) and re-renders the
// server-rendered tables from /ui/fragment when something changes; samples role dominant
// shares from /api/v1/roles into a small SVG chart. Served by the master, no build step.
(function () {
  "use strict";
  var MAX_POINTS = 180;
  var history = {}; // role -> [[unix ms, share], ...]
  var timer = null;
  var colors = ["#3f6ad8", "#d84f3f", "#2e9d58", "#b06fd8", "#d8a23f", "#3fb8d8", "#8a5a3a"];

  function refresh() {
    timer = null;
    fetch("/ui/fragment", { credentials: "same-origin" })
      .then(function (r) { return r.ok ? r.text() : Promise.reject(r.status); })
      .then(function (html) {
        var main = document.getElementById("main");
        if (main) { main.innerHTML = html; }
        document.body.dataset.refreshed = String(Date.now());
      })
      .catch(function () {});
  }

  function schedule() {
    if (!timer) { timer = setTimeout(refresh, 300); }
  }

  function sample() {
    fetch("/api/v1/roles", { credentials: "same-origin" })
      .then(function (r) { return r.ok ? r.json() : Promise.reject(r.status); })
      .then(function (roles) {
        var t = Date.now();
        roles.forEach(function (r) {
          var h = history[r.name] || (history[r.name] = []);
          h.push([t, Number(r.dominant_share) || 0]);
          if (h.length > MAX_POINTS) { h.shift(); }
        });
        draw();
      })
      .catch(function () {});
  }

  function draw() {
    var svg = document.getElementById("shares");
    if (!svg) { return; }
    var w = svg.clientWidth || 800, h = svg.clientHeight || 180, pad = 24;
    var names = Object.keys(history).sort();
    var t0 = Infinity, t1 = -Infinity, top = 0.05;
    names.forEach(function (n) {
      history[n].forEach(function (p) {
        t0 = Math.min(t0, p[0]); t1 = Math.max(t1, p[0]); top = Math.max(top, p[1]);
      });
    });
    if (t1 <= t0) { t1 = t0 + 1; }
    var parts = ['<line x1="' + pad + '" y1="' + (h - pad) + '" x2="' + (w - 4) + '" y2="' + (h - pad) + '" stroke="#ccc"/>',
      '<text x="2" y="12" font-size="10" fill="#888">' + top.toFixed(2) + '</text>',
      '<text x="2" y="' + (h - pad) + '" font-size="10" fill="#888">0</text>'];
    names.forEach(function (n, i) {
      var c = colors[i % colors.length];
      var pts = history[n].map(function (p) {
        var x = pad + (p[0] - t0) / (t1 - t0) * (w - pad - 4);
        var y = (h - pad) - p[1] / top * (h - pad - 8);
        return x.toFixed(1) + "," + y.toFixed(1);
      }).join(" ");
      parts.push('<polyline fill="none" stroke-width="2" stroke="' + c + '" points="' + pts + '"><title>' + n + '</title></polyline>');
      parts.push('<text class="legend" x="' + (pad + 8 + i * 110) + '" y="' + (h - 6) + '" font-size="11" fill="' + c + '">' + n.replace(/[<&>"]/g, "") + '</text>');
    });
    svg.innerHTML = parts.join("");
  }

  function log(e) {
    var ul = document.getElementById("events");
    if (!ul) { return; }
    var li = document.createElement("li");
    var what = e.type;
    if (e.name) { what += " " + e.name; }
    if (e.state) { what += " " + e.state; }
    if (e.what) { what += " (" + e.what + ")"; }
    li.textContent = new Date(e.at_ms || Date.now()).toLocaleTimeString() + " " + what;
    ul.insertBefore(li, ul.firstChild);
    while (ul.children.length > 50) { ul.removeChild(ul.lastChild); }
  }

  var live = document.getElementById("live");
  // The last hour from the master's persistent history fills the panel on load; after a
  // reconnect (the same URL) only what is newer than the last event shown is added.
  var lastSeen = 0;
  function connect() {
    var es = new EventSource("/api/v1/events?since=1h");
    es.onopen = function () {
      if (live) { live.textContent = "live"; }
      document.body.dataset.live = "connected";
    };
    es.onerror = function () {
      if (live) { live.textContent = "reconnecting"; }
      document.body.dataset.live = "disconnected";
    };
    es.onmessage = function (m) {
      var e;
      try { e = JSON.parse(m.data); } catch (_) { return; }
      if (e.type === "snapshot") { return; }
      if (e.history) {
        if (e.at_ms > lastSeen) { lastSeen = e.at_ms; log(e); }
        return;
      }
      lastSeen = Date.now();
      log(e);
      schedule();
      if (e.type === "dropped") { es.close(); setTimeout(connect, 1000); }
    };
  }
  connect();
  sample();
  // GPU samples and shares change without events: refresh them every few seconds too.
  setInterval(function () { sample(); refresh(); }, 5000);
})();
