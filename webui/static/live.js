// Refreshes the page's live part (data-live: seconds) in place.
(function () {
  var el = document.querySelector('[data-live]');
  var every = el ? 1000 * Number(el.getAttribute('data-live')) : 0;
  if (!every) return;
  function tick() {
    fetch(location.href, { credentials: 'same-origin' })
      .then(function (r) { if (!r.ok) throw new Error(r.status); return r.text(); })
      .then(function (t) {
        var n = new DOMParser().parseFromString(t, 'text/html').querySelector('[data-live]');
        if (n) el.innerHTML = n.innerHTML;
      })
      .catch(function () {})
      .finally(function () { setTimeout(tick, every); });
  }
  setTimeout(tick, every);
})();
