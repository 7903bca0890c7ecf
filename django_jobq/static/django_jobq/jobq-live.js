/* Live figures on the django-jobq admin pages, updated in place (no reload, no library, no
   CDN). A page opts in with data-jobq-live="<JSON url>" on an element; this script polls that
   url every data-jobq-every seconds (default 2), applies the figures to the elements named
   in the JSON's keys, and says how fresh they are ("updated 3s ago"). A job page stops
   polling once its job has finished. */
(function () {
  "use strict";
  var root = document.querySelector("[data-jobq-live]");
  if (!root) {
    return;
  }
  var url = root.getAttribute("data-jobq-live");
  var every = Math.max(1, parseInt(root.getAttribute("data-jobq-every") || "2", 10)) * 1000;
  var updated = document.getElementById("jobq-updated");
  var last = Date.now();
  var problem = null;
  var finished = false;
  var polls = 0; /* answered polls, on the root as data-jobq-polls (tests wait on it) */

  function byId(id) {
    return document.getElementById(id);
  }

  function tick() {
    if (!updated) {
      return;
    }
    var seconds = Math.max(0, Math.round((Date.now() - last) / 1000));
    var text = "updated " + seconds + "s ago";
    if (problem) {
      text += " (last try failed: " + problem + ")";
    } else if (finished) {
      text += " (finished: reload for the result)";
    }
    updated.textContent = text;
  }

  function applyJob(data) {
    var badge = byId("jobq-row-state");
    if (badge && data.state) {
      badge.textContent = data.label || data.state;
      badge.className = "jobq-state jobq-state-" + data.state;
    }
    var box = byId("jobq-progress-bar-box");
    var bar = byId("jobq-progress-bar");
    if (box && bar) {
      box.hidden = data.percent === null;
      if (data.percent !== null) {
        bar.firstElementChild.style.width = data.percent + "%";
        bar.setAttribute("aria-valuenow", String(Math.round(data.percent)));
        byId("jobq-progress-percent").textContent = Math.round(data.percent) + "%";
      }
    }
    var text = byId("jobq-progress");
    if (text) {
      text.hidden = data.progress === null;
      text.textContent = data.progress === null ? "" : data.progress;
      byId("jobq-no-progress").hidden = data.progress !== null;
    }
    finished = Boolean(data.finished);
  }

  function applyCells(data) {
    /* Pages with tables: {"cells": {"<element id>": "text", ...}} */
    var cells = data.cells || {};
    Object.keys(cells).forEach(function (id) {
      var cell = byId(id);
      if (cell) {
        cell.textContent = cells[id];
      }
    });
  }

  function applyHtml(data) {
    /* Pages with tables: {"html": {"<element id>": "<rows rendered by the server>"}}, the
       same partial templates as the page itself, escaped by Django. */
    var parts = data.html || {};
    Object.keys(parts).forEach(function (id) {
      var element = byId(id);
      var hold = element && element.getAttribute("data-jobq-hold");
      if (hold && element.querySelector(hold)) {
        return; /* the operator is choosing rows for an action: keep them as they are */
      }
      /* Unchanged parts stay as they are (a job page's log box while no line came in): an
         operator selecting a line keeps the selection. */
      if (element && element.jobqHtml !== parts[id]) {
        element.jobqHtml = parts[id];
        element.innerHTML = parts[id];
      }
    });
  }

  function poll() {
    fetch(url, {credentials: "same-origin", cache: "no-store",
                headers: {"Accept": "application/json"}})
      .then(function (response) {
        if (!response.ok) {
          throw new Error("HTTP " + response.status);
        }
        return response.json();
      })
      .then(function (data) {
        problem = null;
        last = Date.now();
        if ("state" in data) {
          applyJob(data);
        }
        applyCells(data);
        applyHtml(data);
        polls += 1;
        root.setAttribute("data-jobq-polls", String(polls));
        tick();
        if (!finished) {
          window.setTimeout(poll, every);
        }
      })
      .catch(function (error) {
        problem = error.message;
        tick();
        window.setTimeout(poll, every * 2);
      });
  }

  window.setInterval(tick, 1000);
  window.setTimeout(poll, every);
}());

/* A long run over a filter (filtered.html) or a queue's dead letters (dead.html) goes on by
   itself: a form with data-jobq-autosubmit="N" is sent again after N seconds while its
   "go on by itself" box (#jobq-keep-going) stays ticked. Unticking it stops after the
   current request. */
(function () {
  "use strict";
  var form = document.querySelector("form[data-jobq-autosubmit]");
  if (!form) {
    return;
  }
  var seconds = Math.max(1, parseInt(form.getAttribute("data-jobq-autosubmit"), 10) || 2);
  window.setTimeout(function () {
    var keep = document.getElementById("jobq-keep-going");
    if (keep && keep.checked) {
      form.submit();
    }
  }, seconds * 1000);
}());
