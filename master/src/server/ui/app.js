// Gantry dashboard, live part: follows /api/v1/events (server-sent events) and re-renders the
// page's server-rendered <main> from its fragment URL (main's data-fragment plus the page's
// query) when something changes; filters and sorts tables; follows a task's logs into its
// <pre>s; samples role dominant shares from /api/v1/roles into a small SVG chart (overview).
// Served by the master, no build step.
(function () {
  "use strict";
  var MAX_POINTS = 180;
  var history = {}; // role -> [[unix ms, share], ...]
  var timer = null;
  var colors = ["#3f6ad8", "#d84f3f", "#2e9d58", "#b06fd8", "#d8a23f", "#3fb8d8", "#8a5a3a"];

  // The page's <main> from its fragment URL plus the page's own query (filter and sort).
  function fragmentUrl() {
    var main = document.getElementById("main");
    var src = main && main.dataset.fragment;
    if (!src) { return null; }
    var q = location.search.replace(/^\?/, "");
    return q ? src + (src.indexOf("?") < 0 ? "?" : "&") + q : src;
  }

  function refresh() {
    timer = null;
    var url = fragmentUrl();
    if (!url) { return; }
    fetch(url, { credentials: "same-origin" })
      .then(function (r) { return r.ok ? r.text() : Promise.reject(r.status); })
      .then(function (html) {
        var main = document.getElementById("main");
        if (main) { main.innerHTML = html; }
        filter();
        document.body.dataset.refreshed = String(Date.now());
      })
      .catch(function () {});
  }

  // The filter box: hides the rows without the text at once (the server filters the next
  // refresh the same way, from ?q= in the address).
  function filter() {
    var box = document.getElementById("filter");
    var q = box ? box.value.trim().toLowerCase() : "";
    document.querySelectorAll("table.sortable tbody.item").forEach(function (tb) {
      tb.hidden = q !== "" && tb.firstElementChild.textContent.toLowerCase().indexOf(q) < 0;
    });
  }

  function setQuery(changes) {
    var p = new URLSearchParams(location.search);
    Object.keys(changes).forEach(function (k) {
      if (changes[k]) { p.set(k, changes[k]); } else { p.delete(k); }
    });
    var s = p.toString();
    window.history.replaceState(null, "", location.pathname + (s ? "?" + s : ""));
  }

  var box = document.getElementById("filter");
  if (box) {
    box.addEventListener("input", function () {
      setQuery({ q: box.value.trim() });
      filter();
    });
  }

  // A click on a column's header: the page sorted by it (the server sorts; the link works
  // without script too).
  document.addEventListener("click", function (ev) {
    var a = ev.target.closest ? ev.target.closest("th[data-col] a") : null;
    if (!a || !fragmentUrl()) { return; }
    ev.preventDefault();
    var p = new URLSearchParams(a.getAttribute("href").replace(/^\?/, ""));
    setQuery({ sort: p.get("sort"), dir: p.get("dir") });
    refresh();
  });

  // A task's output: each <pre data-follow> reads its URL as a stream (same origin) and
  // appends what arrives, as text, until the task has ended and all is read.
  var MAX_LOG = 1 << 20;
  function follow(pre) {
    fetch(pre.dataset.follow, { credentials: "same-origin" })
      .then(function (r) {
        if (!r.ok || !r.body) {
          return r.text().then(function (t) {
            var why = t;
            try { why = JSON.parse(t).message || t; } catch (_) {}
            pre.dataset.error = String(r.status);
            pre.textContent = "(no output: " + why + ")";
          });
        }
        var reader = r.body.getReader();
        var dec = new TextDecoder();
        pre.dataset.following = "true";
        function step(res) {
          if (res.done) {
            pre.textContent += dec.decode();
            pre.dataset.following = "ended";
            return;
          }
          var atEnd = pre.scrollTop + pre.clientHeight >= pre.scrollHeight - 4;
          var t = pre.textContent + dec.decode(res.value, { stream: true });
          if (t.length > MAX_LOG) { t = t.slice(t.length - MAX_LOG); }
          pre.textContent = t;
          if (atEnd) { pre.scrollTop = pre.scrollHeight; }
          return reader.read().then(step);
        }
        return reader.read().then(step);
      })
      .catch(function (e) { pre.dataset.following = "failed"; pre.textContent += "\n(" + e + ")"; });
  }
  document.querySelectorAll("pre[data-follow]").forEach(follow);

  function schedule() {
    if (!timer) { timer = setTimeout(refresh, 300); }
  }

  function sample() {
    if (!document.getElementById("shares")) { return; }
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
