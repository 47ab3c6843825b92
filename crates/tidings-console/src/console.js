// The console works without this file: it only refreshes, in place, the
// part of a page that asks for it (`<main data-refresh="seconds">`), while
// the tab is visible, keeping the scroll position.
(() => {
  const main = document.querySelector("main[data-refresh]");
  if (!main) return;
  const every = Math.max(1, Number(main.dataset.refresh)) * 1000;
  const refresh = async () => {
    if (document.hidden) return;
    try {
      const answer = await fetch(location.href, { credentials: "same-origin" });
      if (!answer.ok) return;
      const page = new DOMParser().parseFromString(await answer.text(), "text/html");
      const fresh = page.querySelector("main");
      if (fresh) main.replaceChildren(...fresh.childNodes);
    } catch (_) {
      // The next round tries again.
    }
  };
  setInterval(refresh, every);
})();
