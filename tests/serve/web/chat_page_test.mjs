// The chat page (GET /) in a real browser, against the server's own API as the reference.
//
//   node chat_page_test.mjs BASE_URL OUTDIR        (TPCLI_API_KEY: the server's --api-key, if any;
//                                                   CHROMIUM: the browser, default /usr/bin/chromium)
//
// Headless Chromium loads the page, sets a system prompt, temperature 0 and max tokens, sends two
// turns and waits for each streamed reply; each reply must equal what a plain non-streaming POST
// /v1/chat/completions returns for the same messages (greedy decoding: one answer). Also: the
// status line names the device count of GET /status, an error body is shown as its message, and
// Stop ends a long reply. Screenshots (desktop and phone width) go to OUTDIR. Exit 1 on any mismatch.
import fs from "node:fs";
import path from "node:path";
import puppeteer from "puppeteer-core";

const [baseArg, outDir] = process.argv.slice(2);
if (!baseArg || !outDir) {
  console.error("usage: node chat_page_test.mjs BASE_URL OUTDIR");
  process.exit(2);
}
const BASE = baseArg.replace(/\/+$/, "");
const API_KEY = process.env.TPCLI_API_KEY || "";
const CHROMIUM = process.env.CHROMIUM || "/usr/bin/chromium";
const SYSTEM = "You are a storyteller.";
const MAX_TOKENS = 24;
const TIMEOUT_MS = 120_000;

function fail(message) {
  console.error("chat_page_test: FAIL: " + message);
  process.exitCode = 1;
  throw new Error(message);
}

function check(ok, message) {
  if (!ok) fail(message);
  console.log("chat_page_test: ok: " + message);
}

async function api(route, body) {
  const headers = { "Content-Type": "application/json" };
  if (API_KEY) headers.Authorization = "Bearer " + API_KEY;
  const response = await fetch(BASE + route, body === undefined ? { headers }
                                : { method: "POST", headers, body: JSON.stringify(body) });
  return { status: response.status, json: await response.json() };
}

// The settings panel is a <details>: open it, then type into the fields as a user would.
async function setField(page, selector, value) {
  await page.$eval(selector, (e) => { e.closest("details").open = true; e.value = ""; });
  await page.type(selector, String(value));
}

// Sends `text` from the page and waits until the page is idle again; returns the last bubble.
async function sendTurn(page, text) {
  const before = await page.$$eval("#messages .msg", (all) => all.length);
  await page.type("#input", text);
  await page.click("#send");
  await page.waitForFunction((n) => document.querySelectorAll("#messages .msg").length >= n + 2 &&
                                    document.body.dataset.state === "idle",
                             { timeout: TIMEOUT_MS }, before);
  return page.$$eval("#messages .msg", (all) => {
    const last = all[all.length - 1];
    return { cls: last.className, text: last.querySelector(".text").textContent, done: last.dataset.done === "1" };
  });
}

async function main() {
  fs.mkdirSync(outDir, { recursive: true });
  const status = await api("/status");
  check(status.status === 200 && Number.isInteger(status.json.devices), `GET /status answers devices = ${status.json.devices}`);
  const devices = status.json.devices;

  const browser = await puppeteer.launch({
    executablePath: CHROMIUM, headless: true,
    args: ["--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage"],
  });
  try {
    const page = await browser.newPage();
    const pageErrors = [];
    page.on("pageerror", (e) => pageErrors.push(String(e)));
    await page.setViewport({ width: 900, height: 800 });
    const response = await page.goto(BASE + "/", { waitUntil: "load" });
    check(response.status() === 200 && (response.headers()["content-type"] || "").startsWith("text/html"),
          `GET / is HTML (${response.status()} ${response.headers()["content-type"]})`);

    // With --api-key, /status answers 401 until the key is in; the page says so.
    if (API_KEY) {
      await page.waitForFunction(() => /API key/i.test(document.getElementById("status").textContent), { timeout: 10_000 })
        .catch(() => {});
      const denied = await page.$eval("#status", (e) => e.textContent);
      check(/API key/i.test(denied), `without the key, the status line says why: "${denied}"`);
      await setField(page, "#api-key", API_KEY);
      await page.$eval("#api-key", (e) => e.dispatchEvent(new Event("change")));
    }

    // The status line: filled from /status within a poll.
    const deviceWord = devices + (devices === 1 ? " device" : " devices");
    await page.waitForFunction((w) => document.getElementById("status").textContent.includes(w),
                               { timeout: 10_000 }, deviceWord).catch(() => {});
    const statusText = await page.$eval("#status", (e) => e.textContent);
    check(statusText.includes(deviceWord), `status line "${statusText}" names "${deviceWord}"`);
    const holds = await page.$$eval("#holds li", (all) => all.map((li) => li.textContent));
    check(JSON.stringify(holds) === JSON.stringify(status.json.holds || []),
          `the mesh panel lists what each device holds (${holds.length} lines)`);

    await setField(page, "#system", SYSTEM);
    await setField(page, "#temperature", 0);
    await setField(page, "#max-tokens", MAX_TOKENS);

    // Two turns: the second carries the first reply back, as the page's messages array.
    const messages = [{ role: "system", content: SYSTEM }];
    for (const text of ["Tell me a story about a cat.", "And then what happened?"]) {
      const reply = await sendTurn(page, text);
      check(reply.cls.includes("assistant") && reply.done, `turn "${text}": a finished assistant reply (${reply.cls})`);
      messages.push({ role: "user", content: text });
      const ref = await api("/v1/chat/completions", { messages, temperature: 0, max_tokens: MAX_TOKENS });
      if (ref.status !== 200) fail(`reference POST /v1/chat/completions: ${ref.status} ${JSON.stringify(ref.json)}`);
      const expected = ref.json.choices[0].message.content;
      check(reply.text === expected,
            `turn "${text}": the streamed page reply equals the API's (${JSON.stringify(reply.text)} vs ${JSON.stringify(expected)})`);
      check(reply.text.length > 0, `turn "${text}": the reply is not empty`);
      messages.push({ role: "assistant", content: expected });
    }
    const speed = await page.$eval("#status", (e) => e.textContent);
    check(/last reply [0-9.]+ tok\/s/.test(speed), `status line shows the last reply's speed: "${speed}"`);
    await page.screenshot({ path: path.join(outDir, "chat_page.png"), fullPage: true });

    // An error body is shown as its message: max tokens far beyond any context.
    await setField(page, "#max-tokens", 100000000);
    const errReply = await sendTurn(page, "This request is too long.");
    const errRef = await api("/v1/chat/completions",
                             { messages: messages.concat([{ role: "user", content: "This request is too long." }]),
                               temperature: 0, max_tokens: 100000000 });
    check(errRef.status >= 400 && errReply.cls.includes("error") && errReply.text === errRef.json.error.message,
          `an error is shown as its message: ${JSON.stringify(errReply.text)} (API: ${errRef.status})`);

    // Stop: a reply as long as the context allows, stopped at its first token: a click from
    // inside the page (a MutationObserver), since a small model streams a whole reply faster
    // than puppeteer's round trips. A reply that still finishes first is reported, not failed.
    await setField(page, "#max-tokens", "");
    await setField(page, "#temperature", 1);
    await page.evaluate(() => {
      const observer = new MutationObserver(() => {
        const reply = document.querySelector(".msg.assistant.streaming .text");
        if (reply && reply.textContent.length > 0) {
          observer.disconnect();
          document.getElementById("stop").click();
        }
      });
      observer.observe(document.getElementById("messages"), { childList: true, subtree: true, characterData: true });
    });
    await page.type("#input", "Tell me a very long story.");
    await page.click("#send");
    await page.waitForFunction(() => document.body.dataset.state === "idle", { timeout: TIMEOUT_MS });
    const stopped = await page.$$eval("#messages .msg", (all) => all[all.length - 1].textContent);
    if (stopped.endsWith("(stopped)")) {
      check(await page.$eval("#stop", (e) => e.hidden) && !(await page.$eval("#send", (e) => e.disabled)),
            "Stop ended the reply; Send is back");
      let running = -1;
      for (let i = 0; i < 50 && running !== 0; i++) {
        running = (await api("/status")).json.running;
        if (running !== 0) await new Promise((r) => setTimeout(r, 100));
      }
      check(running === 0, `the server let the stopped sequence go (running ${running})`);
    } else {
      console.log("chat_page_test: note: the reply finished before Stop was clicked; Stop not checked");
    }

    await page.setViewport({ width: 390, height: 760 });
    await page.screenshot({ path: path.join(outDir, "chat_page_phone.png") });
    const overflow = await page.evaluate(() => document.documentElement.scrollWidth - window.innerWidth);
    check(overflow <= 0, `no horizontal scrolling at phone width (overflow ${overflow}px)`);
    check(pageErrors.length === 0, `no script errors in the page${pageErrors.length ? ": " + pageErrors.join("; ") : ""}`);
    console.log("chat_page_test: screenshots in " + path.resolve(outDir));
  } finally {
    await browser.close();
  }
}

main().catch((e) => {
  if (!process.exitCode) console.error("chat_page_test: FAIL: " + (e && e.stack || e));
  process.exitCode = 1;
});
