// Runs one job for the Python side (tests/test_web.py, edgebert/targets/web.py) and POSTs the result back:
// the first-run check, then `texts` tokenized and classified, then `inputs` timed (batch 1, each example at
// its own length, as device_tests' harness times them) and run once more, untimed, for the metric.
import { encode, feeds, firstRunCheck, loadBundle, ORT_VERSION, output, run } from "./edgebert.js";

const job = await (await fetch(new URLSearchParams(location.search).get("job"))).json();
const post = (body) => fetch(job.report, { method: "POST", body: JSON.stringify(body) });
const fail = (message) => {
  document.getElementById("status").textContent = `error: ${message}`;
  return post({ error: String(message) });
};
addEventListener("error", (e) => fail(e.message));
addEventListener("unhandledrejection", (e) => fail(e.reason?.message ?? e.reason));

async function browser() {
  const brands = await navigator.userAgentData?.getHighEntropyValues(["fullVersionList"]).catch(() => null);
  const full = brands?.fullVersionList?.find((b) => /Chrom/.test(b.brand));
  return full ? `Chromium ${full.version}` : navigator.userAgent;
}

/** Example `i` of the eval set's columns, at its own length. */
const example = (inputs, i) => Object.fromEntries(Object.entries(inputs).map(([k, rows]) => [k, rows[i]]));

const prepared = (bundle, i) => feeds(bundle, example(job.inputs, i % job.inputs.input_ids.length));

/** The cold first inference, timed alone: before the first-run check warms the session. */
async function first(bundle) {
  const p = prepared(bundle, 0);
  const started = performance.now();
  await bundle.session.run(p);
  return performance.now() - started;
}

async function bench(bundle, firstMs) {
  // At least job.warmup runs and job.warmup_s seconds: V8 moves hot WASM code to its optimizing compiler as it runs.
  let warmup = 0;
  const warm = performance.now();
  for (; warmup < job.warmup || performance.now() - warm < job.warmup_s * 1000; warmup++) {
    await bundle.session.run(prepared(bundle, warmup));
  }
  const ms = [];
  const begin = performance.now();
  for (let i = 0; job.duration ? performance.now() - begin < job.duration * 1000 : i < job.runs; i++) {
    const p = prepared(bundle, warmup + i);
    const started = performance.now();
    await bundle.session.run(p);
    ms.push(performance.now() - started);
  }
  const outputs = [];
  for (let i = 0; i < job.inputs.input_ids.length; i++) {
    const t = await output(bundle, prepared(bundle, i));
    outputs.push({ dims: t.dims, values: Array.from(t.data) });
  }
  return { load_ms: bundle.loadMs, first_inference_ms: firstMs, warmup_runs: warmup, latency_runs_ms: ms, outputs };
}

try {
  const bundle = await loadBundle(job.bundle, { model: job.model, tokenizer: Boolean(job.texts) });
  const firstMs = job.inputs ? await first(bundle) : null;
  const result = {
    browser: await browser(), user_agent: navigator.userAgent, onnxruntime_web: ORT_VERSION, threads: 1,
    simd: true, cross_origin_isolated: self.crossOriginIsolated, bytes: bundle.bytes, sha256: bundle.sha256,
    check: await firstRunCheck(bundle),
  };
  if (job.texts) {
    result.texts = [];
    for (const text of job.texts) {
      const e = encode(bundle, text);
      result.texts.push({ ...e, outputs: await run(bundle, feeds(bundle, e)) });
    }
  }
  if (job.inputs) result.bench = await bench(bundle, firstMs);
  document.getElementById("status").textContent = "done";
  await post(result);
} catch (e) {
  await fail(e.message ?? e);
}
