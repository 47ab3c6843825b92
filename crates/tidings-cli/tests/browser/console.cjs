// Drives the console in a real headless browser (Debian's chromium through
// playwright-core) and prints, as one JSON object, what a person would see.
//
//   node console.cjs <step> [argument]
//
// Steps: `read` signs in, reads the overview's figures, the dead-letter
// causes with their counts and the first letter of the first cause;
// `redrive <fingerprint>` signs in and presses that cause's Redrive button;
// `read` saves the sign-in page first; `key <key> <shot>` finds a key with
// the search box, reads each of its messages' story, then opens the first
// message's own page; `edit <dead-letter-id> <json>` signs in, replaces the payload
// in the letter's edit form with <json> and submits it, then reads the letter's
// page it lands on; `letters` reads the dead-letter page again. Each page is saved as a
// screenshot in TIDINGS_SHOTS. The console is at TIDINGS_CONSOLE_URL, the
// token is TIDINGS_CONSOLE_TOKEN, chromium is TIDINGS_CHROMIUM.
const { chromium } = require("playwright-core");

const base = process.env.TIDINGS_CONSOLE_URL;
const token = process.env.TIDINGS_CONSOLE_TOKEN;
const shots = process.env.TIDINGS_SHOTS;

async function signIn(page, name) {
  await page.goto(`${base}/login`);
  if (name) await shot(page, name);
  await page.fill('input[name="token"]', token);
  await Promise.all([page.waitForURL(`${base}/`), page.click('form.login button[type="submit"]')]);
}

async function shot(page, name) {
  await page.screenshot({ path: `${shots}/${name}.png`, fullPage: true });
}

async function causes(page) {
  return page.$$eval("#causes tbody tr", (rows) =>
    rows.map((r) => ({
      fingerprint: r.dataset.fingerprint,
      count: Number(r.querySelector("td.count").textContent.trim()),
      text: r.textContent,
    })),
  );
}

async function read(page) {
  await signIn(page, "login");
  const figures = await page.$$eval("[data-figure]", (els) =>
    Object.fromEntries(els.map((e) => [e.dataset.figure, e.querySelector(".value").textContent.trim()])),
  );
  const signedIn = await page.textContent("#signed-in");
  const charts = await page.$$eval("svg.spark polyline", (lines) => lines.length);
  await shot(page, "overview");
  await page.click('nav a[href="/dead-letters"]');
  await page.waitForSelector("#dead-letter-count");
  const found = await causes(page);
  await shot(page, "dead-letters");
  let letter = null;
  if (found.length > 0) {
    await page.click(`tr[data-fingerprint="${found[0].fingerprint}"] a`);
    await page.waitForSelector("#letters");
    await shot(page, "dead-letters-of-a-cause");
    await page.click("#letters tbody tr:first-child a");
    await page.waitForSelector("#body");
    letter = {
      state: await page.textContent("#state"),
      body: await page.textContent("#body"),
      errors: await page.$$eval("#errors tbody tr", (rows) => rows.length),
      actions: await page.$$eval(".actions button", (bs) => bs.map((b) => b.textContent.trim())),
    };
    await shot(page, "dead-letter");
  }
  return { figures, signedIn, charts, causes: found, letter };
}

async function redrive(page, fingerprint) {
  await signIn(page);
  await page.goto(`${base}/dead-letters`);
  const button = page.locator(`tr[data-fingerprint="${fingerprint}"] button.redrive`);
  const label = (await button.textContent()).trim();
  await Promise.all([page.waitForURL(`${base}/dead-letters/redrive`), button.click()]);
  const outcome = (await page.textContent("#outcome")).trim();
  await shot(page, "redriven");
  return { label, outcome };
}

async function key(page, key, name) {
  await signIn(page);
  await page.fill('form.find input[name="q"]', key);
  await Promise.all([page.waitForURL(/\/keys\//), page.press('form.find input[name="q"]', "Enter")]);
  const messages = await page.$$eval("section.story", (sections) =>
    sections.map((s) => ({
      message: s.dataset.message,
      verdict: s.querySelector(".verdict").textContent.trim(),
      handled: [...s.querySelectorAll("table.handled tbody tr td:first-child")].map((td) => td.textContent.trim()),
      deadLetters: [...s.querySelectorAll("table.dead-letters tbody tr")].map((tr) => ({
        consumer: tr.children[1].textContent.trim(),
        state: tr.children[2].textContent.trim(),
      })),
      parked: s.querySelectorAll("table.parked tbody tr").length,
    })),
  );
  await shot(page, name || "key");
  // The first message's own page.
  let message = null;
  if (messages.length > 0) {
    await Promise.all([page.waitForURL(/\/messages\//), page.click("section.story h2 a")]);
    message = {
      id: await page.$eval("section.story", (s) => s.dataset.message),
      verdict: (await page.textContent("section.story .verdict")).trim(),
    };
    await shot(page, `${name || "key"}-message`);
  }
  return { messages, message };
}

async function edit(page, id, json) {
  await signIn(page);
  await page.goto(`${base}/dead-letters/${id}`);
  const before = await page.inputValue("#edit-data");
  await page.fill("#edit-data", json);
  // The form answers with a redirect to the letter's page, which now lists the edit.
  await Promise.all([page.waitForSelector("#edits"), page.click('form.edit button[type="submit"]')]);
  const edits = await page.$$eval("#edits tbody tr", (rows) =>
    rows.map((r) => ({
      id: r.dataset.edit,
      by: r.children[1].textContent.trim(),
      original: r.querySelector("pre.original").textContent,
      edited: r.querySelector("pre.edited").textContent,
    })),
  );
  const seen = {
    url: page.url(),
    before,
    state: await page.textContent("#state"),
    edits,
    form: await page.$$eval("form.edit", (forms) => forms.length),
  };
  await shot(page, "edited");
  return seen;
}

async function letters(page) {
  await signIn(page);
  await page.goto(`${base}/dead-letters`);
  const count = (await page.textContent("#dead-letter-count")).trim();
  await shot(page, "dead-letters-after-redrive");
  return { count, causes: await causes(page) };
}

(async () => {
  const [step, argument] = process.argv.slice(2);
  const browser = await chromium.launch({ executablePath: process.env.TIDINGS_CHROMIUM, headless: true });
  try {
    const page = await browser.newPage({ viewport: { width: 1280, height: 900 } });
    page.setDefaultTimeout(15000);
    const steps = { read, redrive, key, edit, letters };
    if (!steps[step]) {
      throw new Error(`no step ${step}: read, redrive <fingerprint>, key <key> <shot>, edit <id> <json> or letters`);
    }
    const seen = await steps[step](page, argument, process.argv[4]);
    process.stdout.write(JSON.stringify(seen) + "\n");
  } finally {
    await browser.close();
  }
})().catch((e) => {
  process.stderr.write(`${e.stack || e}\n`);
  process.exit(1);
});
