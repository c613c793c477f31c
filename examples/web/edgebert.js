// An edgebert bundle in the browser: model.onnx in ONNX Runtime Web (WASM, SIMD, one thread), text tokenized
// by the bundle's own tokenizer.json, and the first-run check against golden.json (device_tests/verify.py's,
// in JavaScript). index.html uses it for the demo; harness.html for the tests and `edgebert bench --target web`.
import * as ort from "./node_modules/onnxruntime-web/dist/ort.wasm.min.mjs";
import { Tokenizer } from "./node_modules/@huggingface/tokenizers/dist/tokenizers.min.mjs";

ort.env.wasm.numThreads = 1; // one thread: the numbers compare with native 1-thread runs, no isolation needed
ort.env.wasm.simd = true;
ort.env.wasm.wasmPaths = new URL("./node_modules/onnxruntime-web/dist/", import.meta.url).href;

export const ORT_VERSION = ort.env.versions.web;

async function fetchOk(url) {
  const response = await fetch(url);
  if (!response.ok) throw new Error(`${url}: HTTP ${response.status}; serve the whole bundle folder there`);
  return response;
}

async function optionalJson(url) {
  const response = await fetch(url);
  return response.ok ? response.json() : null;
}

async function sha256(bytes) {
  if (!globalThis.crypto?.subtle) return null; // only in secure contexts (https, localhost)
  const digest = await crypto.subtle.digest("SHA-256", bytes);
  return [...new Uint8Array(digest)].map((b) => b.toString(16).padStart(2, "0")).join("");
}

/** The bundle at `url` (a folder): its manifest, model, labels, golden outputs, and tokenizer unless
 * `tokenizer` is false (the bench times pre-tokenized ids). `model` names the ONNX file in it. */
export async function loadBundle(url, { model = "model.onnx", tokenizer = true } = {}) {
  const base = new URL(url.endsWith("/") ? url : `${url}/`, location.href);
  const manifest = await optionalJson(new URL("manifest.json", base));
  const maxLength = manifest?.inputs?.max_length;
  if (tokenizer && !maxLength) {
    throw new Error(`${base}manifest.json has no inputs.max_length: pass a bundle folder written by edgebert`);
  }
  const bytes = new Uint8Array(await (await fetchOk(new URL(model, base))).arrayBuffer());
  const started = performance.now();
  const session = await ort.InferenceSession.create(bytes, { executionProviders: ["wasm"] });
  const loadMs = performance.now() - started;
  const declared = manifest?.inputs?.files?.[model]?.inputs ?? {};
  const bundle = {
    manifest, model, session, loadMs, maxLength,
    bytes: bytes.length,
    sha256: await sha256(bytes),
    listedSha256: manifest?.files?.[model]?.sha256 ?? null,
    dtypes: Object.fromEntries(session.inputNames.map((n) => [n, declared[n]?.dtype ?? "int64"])),
    golden: await optionalJson(new URL("golden.json", base)),
    labels: null,
    tokenizer: null,
  };
  if (tokenizer) {
    const [json, config, labels] = await Promise.all([
      fetchOk(new URL("tokenizer.json", base)).then((r) => r.json()),
      optionalJson(new URL("tokenizer_config.json", base)),
      fetch(new URL("labels.txt", base)).then((r) => (r.ok ? r.text() : "")),
    ]);
    bundle.tokenizer = new Tokenizer(json, config ?? {});
    bundle.labels = labels.split("\n").filter((line) => line.length > 0);
  }
  return bundle;
}

/** What tokenizer.json gives for `text` (one sentence), cut to the manifest's max_length keeping the final
 * special token, as `tokenizers`' right truncation does for the single template ([CLS] A [SEP]). */
export function encode(bundle, text) {
  const e = bundle.tokenizer.encode(text, { return_token_type_ids: true });
  const cut = (a) => (a.length > bundle.maxLength ? [...a.slice(0, bundle.maxLength - 1), a.at(-1)] : a);
  const ids = cut(e.ids);
  return {
    input_ids: ids,
    attention_mask: ids.map(() => 1),
    token_type_ids: e.token_type_ids ? cut(e.token_type_ids) : ids.map(() => 0),
    tokens: cut(e.tokens),
    truncated: e.ids.length > bundle.maxLength,
  };
}

/** The model's feeds for one example ({input_ids, attention_mask, token_type_ids} arrays): batch 1, its
 * own length, each input in the dtype the manifest records (int64 unless exported otherwise). */
export function feeds(bundle, example) {
  const out = {};
  for (const name of bundle.session.inputNames) {
    const values = example[name];
    if (!values) throw new Error(`the model needs ${name}, which the example lacks`);
    out[name] = bundle.dtypes[name] === "int32"
      ? new ort.Tensor("int32", Int32Array.from(values), [1, values.length])
      : new ort.Tensor("int64", BigInt64Array.from(values, BigInt), [1, values.length]);
  }
  return out;
}

/** The model's first output (a tensor: `dims`, `data`) for prepared feeds. */
export async function output(bundle, prepared) {
  return (await bundle.session.run(prepared))[bundle.session.outputNames[0]];
}

/** The first output's values, flat: a classifier's logits, per-token rows, a vector. */
export async function run(bundle, prepared) {
  return Array.from((await output(bundle, prepared)).data);
}

export function softmax(logits) {
  const top = Math.max(...logits);
  const e = logits.map((x) => Math.exp(x - top));
  const sum = e.reduce((a, b) => a + b, 0);
  return e.map((x) => x / sum);
}

/** Tokenize and classify one text: the label (a line of labels.txt), softmax scores, raw outputs. */
export async function classify(bundle, text) {
  const encoding = encode(bundle, text);
  const started = performance.now();
  const logits = await run(bundle, feeds(bundle, encoding));
  const ms = performance.now() - started;
  const best = logits.indexOf(Math.max(...logits));
  return { encoding, logits, ms, label: bundle.labels[best] ?? String(best), scores: softmax(logits) };
}

const argmaxRows = (flat, width) => Array.from({ length: flat.length / width }, (_, i) => {
  const row = flat.slice(i * width, (i + 1) * width);
  return row.indexOf(Math.max(...row));
});

/** The first-run check: this file, in this browser's runtime, against golden.json's outputs, each example
 * alone at its own length; the sha256 against the manifest apart. As `python -m device_tests verify` reports. */
export async function firstRunCheck(bundle) {
  const found = { file: bundle.model, backend: "onnxruntime-web", version: ORT_VERSION, sha256: bundle.sha256,
                  manifest_sha256: bundle.listedSha256 };
  const entry = bundle.golden?.files?.[bundle.model];
  if (!entry) {
    const why = bundle.golden ? `golden.json holds no outputs for ${bundle.model}`
      : "the bundle has no golden.json (compile it again)";
    return { ...found, passed: null, reason: why };
  }
  found.sha256_matches = bundle.sha256 !== null && bundle.sha256 === bundle.listedSha256;
  let worst = 0, differ = 0, predictions = 0;
  for (const [i, example] of bundle.golden.examples.entries()) {
    const got = await run(bundle, feeds(bundle, example));
    const want = entry.outputs[i].flat();
    if (got.length !== want.length) {
      const error = `example ${i} gives ${got.length} outputs where golden.json has ${want.length}: not the file the `
        + "golden outputs were written for";
      return { ...found, passed: false, error };
    }
    got.forEach((g, j) => { worst = Number.isFinite(g) ? Math.max(worst, Math.abs(g - want[j])) : Infinity; });
    if (entry.labels) {
      const width = Array.isArray(entry.outputs[i][0]) ? entry.outputs[i][0].length : want.length; // per token: rows
      const a = argmaxRows(got, width), b = argmaxRows(want, width);
      differ += a.filter((x, j) => x !== b[j]).length;
      predictions += b.length;
    }
  }
  Object.assign(found, { max_abs_diff: worst, tolerance: entry.tolerance, outputs_match: worst <= entry.tolerance });
  if (entry.labels) Object.assign(found, { labels_differ: differ, predictions });
  found.passed = found.sha256_matches && found.outputs_match;
  return found;
}

/** One line, as device_tests/verify.py's `line` writes it. */
export function checkLine(check) {
  const verdict = check.passed === null ? "N/A" : check.passed ? "PASS" : "FAIL";
  const head = `${verdict} ${check.file} (${check.backend} ${check.version}): `;
  if (check.passed === null) return head + check.reason;
  if (check.error) return head + check.error;
  let text = head + (check.sha256 === null ? "sha256 not computed (needs https or localhost)"
    : check.sha256_matches ? "sha256 matches the manifest" : "sha256 differs from the manifest");
  const ok = check.outputs_match;
  text += `; outputs ${ok ? "within" : "OUTSIDE"} tolerance: max |diff| ${check.max_abs_diff.toPrecision(3)} `
    + `${ok ? "<=" : ">"} tol ${check.tolerance.toPrecision(3)}`;
  if (check.labels_differ !== undefined) text += `, ${check.labels_differ} of ${check.predictions} labels differ`;
  return text;
}
