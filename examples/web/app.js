// The demo: load the bundle named by ?bundle= (default bundle/ beside this page), run the first-run check,
// then classify what is typed. The work is in edgebert.js.
import { checkLine, classify, firstRunCheck, loadBundle } from "./edgebert.js";

const $ = (id) => document.getElementById(id);
const where = new URLSearchParams(location.search).get("bundle") ?? "bundle/";
$("where").textContent = where;

try {
  const bundle = await loadBundle(where);
  const check = await firstRunCheck(bundle);
  $("check").textContent = `first-run check: ${checkLine(check)}`;
  $("check").className = check.passed === false ? "fail" : check.passed ? "pass" : "";
  const show = async () => {
    const out = await classify(bundle, $("text").value);
    const line = (tag, text) => Object.assign(document.createElement(tag), { textContent: text });
    const scores = out.scores.map((s, i) =>
      `${bundle.labels[i] ?? i} ${s.toFixed(4)} (logit ${out.logits[i].toFixed(4)})`);
    $("result").replaceChildren(line("h2", out.label), ...scores.map((s) => line("div", s)),
      line("p", `${out.encoding.tokens.length} tokens${out.encoding.truncated ? " (cut to max_length)" : ""}, ` +
                `${out.ms.toFixed(2)} ms`), line("code", out.encoding.tokens.join(" ")));
  };
  $("form").addEventListener("submit", (event) => { event.preventDefault(); show(); });
  $("form").querySelector("button").disabled = false;
  await show(); // the sample text, so the page shows a result as soon as it can
} catch (e) {
  $("check").textContent = `error: ${e.message}`;
  $("check").className = "fail";
}
