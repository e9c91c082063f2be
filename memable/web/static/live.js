// memable dashboard: keep an instance's page current while it has not ended.
// Every few seconds, fetch the page's fragment (#live's data-src) and put it in
// place; once the fragment says the instance ended, reload the page once (its
// actions change) and stop. Without scripts, a <noscript> refresh does the same.
(function () {
  "use strict";
  var live = document.getElementById("live");
  if (!live) { return; }
  var every = parseInt(live.getAttribute("data-every"), 10) || 2000;
  function ended() {
    var state = live.querySelector("[data-terminal]");
    return state !== null && state.getAttribute("data-terminal") === "true";
  }
  function poll() {
    fetch(live.getAttribute("data-src"), { credentials: "same-origin" })
      .then(function (response) {
        if (!response.ok) { throw new Error("HTTP " + response.status); }
        return response.text();
      })
      .then(function (html) {
        live.innerHTML = html;  // the server escaped everything it holds
        live.setAttribute("data-updated", String(Date.now()));
        if (ended()) { window.location.reload(); } else { window.setTimeout(poll, every); }
      })
      .catch(function () { window.setTimeout(poll, every); });
  }
  if (!ended()) { window.setTimeout(poll, every); }
})();
