// Makes the fixture tokenizers in fixtures/ (committed; rerun only to change them):
//   node make_fixtures.mjs TRAINING_TEXT... 
// Trains a small byte-level BPE (deterministic: most frequent pair, ties by the pair's text)
// on the given files and corpus.jsonl, pre-splitting with the GLM pattern, and writes:
//   glm_like.json          GLM-4/5 layout: Split(GLM regex, Isolated) + ByteLevel(use_regex=false),
//                          merges as [a, b] pairs, GLM special tokens, ByteLevel post/decoder
//   gpt2_like.json         ByteLevel(use_regex=true) pre-tokenizer, legacy "a b" merges,
//                          TemplateProcessing adding [gMASK] <sop>, mixed added tokens
//   glm_ignore_merges.json glm_like with ignore_merges and whole-word vocab entries that the
//                          merges cannot reach
//   glm_nfc.json           glm_like with an NFC normalizer and normalized non-special tokens
import { readFileSync, writeFileSync } from "node:fs";

const NUM_MERGES = 1500;
const GLM_PATTERN =
  "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
// The same pattern for JS (training only needs an approximation).
const GLM_JS = /(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+/gu;

function bytesToUnicode() {
  const bs = [];
  for (let b = 33; b <= 126; ++b) bs.push(b);
  for (let b = 0xa1; b <= 0xac; ++b) bs.push(b);
  for (let b = 0xae; b <= 0xff; ++b) bs.push(b);
  const cs = bs.slice();
  let n = 0;
  for (let b = 0; b < 256; ++b) {
    if (!bs.includes(b)) {
      bs.push(b);
      cs.push(256 + n++);
    }
  }
  const map = new Array(256);
  bs.forEach((b, i) => (map[b] = String.fromCodePoint(cs[i])));
  return map;
}
const BYTE_CHAR = bytesToUnicode();
const encoder = new TextEncoder();
const toByteLevel = (s) => Array.from(encoder.encode(s), (b) => BYTE_CHAR[b]);

const files = process.argv.slice(2);
let text = readFileSync(new URL("./corpus.jsonl", import.meta.url), "utf8")
  .split("\n").filter((l) => l.trim()).map((l) => JSON.parse(l)).join("\n");
for (const f of files) text += "\n" + readFileSync(f, "utf8");

// Word frequencies (each word as an array of byte-level symbols).
const counts = new Map();
for (const m of text.matchAll(GLM_JS)) counts.set(m[0], (counts.get(m[0]) ?? 0) + 1);
const words = [...counts.entries()].map(([w, c]) => ({ syms: toByteLevel(w), count: c }));

const vocab = {};
for (let b = 0; b < 256; ++b) vocab[BYTE_CHAR[b]] = b;
let nextId = 256;
const merges = [];
for (let m = 0; m < NUM_MERGES; ++m) {
  const pairs = new Map();
  for (const w of words) {
    for (let i = 0; i + 1 < w.syms.length; ++i) {
      const key = w.syms[i] + "\u0000" + w.syms[i + 1];
      pairs.set(key, (pairs.get(key) ?? 0) + w.count);
    }
  }
  let best = null;
  let bestCount = 1;  // a pair must occur at least twice
  for (const [key, c] of pairs) {
    if (c > bestCount || (c === bestCount && best !== null && key < best)) {
      best = key;
      bestCount = c;
    }
  }
  if (best === null) break;
  const [a, b] = best.split("\u0000");
  const merged = a + b;
  if (!(merged in vocab)) vocab[merged] = nextId++;
  merges.push([a, b]);
  for (const w of words) {
    const out = [];
    for (let i = 0; i < w.syms.length; ++i) {
      if (i + 1 < w.syms.length && w.syms[i] === a && w.syms[i + 1] === b) {
        out.push(merged);
        ++i;
      } else {
        out.push(w.syms[i]);
      }
    }
    w.syms = out;
  }
}

const SPECIAL = ["<|endoftext|>", "[MASK]", "[gMASK]", "[sMASK]", "<sop>", "<eop>", "<|system|>",
  "<|user|>", "<|assistant|>", "<|observation|>", "<|begin_of_image|>", "<|end_of_image|>",
  "<|begin_of_video|>", "<|end_of_video|>"];
const NOT_SPECIAL = ["<think>", "</think>", "<tool_call>", "</tool_call>", "<arg_key>",
  "</arg_key>", "<arg_value>", "</arg_value>", "/nothink"];

function addedTokens(firstId, normalizedNonSpecial) {
  let id = firstId;
  const list = [];
  for (const content of SPECIAL) {
    list.push({ id: id++, content, single_word: false, lstrip: false, rstrip: false,
                normalized: false, special: true });
  }
  for (const content of NOT_SPECIAL) {
    list.push({ id: id++, content, single_word: false, lstrip: false, rstrip: false,
                normalized: normalizedNonSpecial, special: false });
  }
  return list;
}

function model(vocabObj, mergeList, ignoreMerges) {
  return { type: "BPE", dropout: null, unk_token: null, continuing_subword_prefix: null,
           end_of_word_suffix: null, fuse_unk: false, byte_fallback: false,
           ignore_merges: ignoreMerges, vocab: vocabObj, merges: mergeList };
}
const byteLevel = { type: "ByteLevel", add_prefix_space: true, trim_offsets: true, use_regex: true };
const vocabSize = Object.keys(vocab).length;

const glmLike = {
  version: "1.0", truncation: null, padding: null,
  added_tokens: addedTokens(vocabSize, false),
  normalizer: null,
  pre_tokenizer: { type: "Sequence", pretokenizers: [
    { type: "Split", pattern: { Regex: GLM_PATTERN }, behavior: "Isolated", invert: false },
    { type: "ByteLevel", add_prefix_space: false, trim_offsets: true, use_regex: false }] },
  post_processor: { type: "ByteLevel", add_prefix_space: true, trim_offsets: false, use_regex: true },
  decoder: byteLevel,
  model: model(vocab, merges, false),
};

const gmask = vocabSize + SPECIAL.indexOf("[gMASK]");
const sop = vocabSize + SPECIAL.indexOf("<sop>");
const gpt2Like = {
  version: "1.0", truncation: null, padding: null,
  added_tokens: addedTokens(vocabSize, true),
  normalizer: null,
  pre_tokenizer: { type: "ByteLevel", add_prefix_space: false, trim_offsets: true, use_regex: true },
  post_processor: {
    type: "TemplateProcessing",
    single: [{ SpecialToken: { id: "[gMASK]", type_id: 0 } },
             { SpecialToken: { id: "<sop>", type_id: 0 } },
             { Sequence: { id: "A", type_id: 0 } }],
    pair: [{ SpecialToken: { id: "[gMASK]", type_id: 0 } },
           { SpecialToken: { id: "<sop>", type_id: 0 } },
           { Sequence: { id: "A", type_id: 0 } }, { Sequence: { id: "B", type_id: 1 } }],
    special_tokens: {
      "[gMASK]": { id: "[gMASK]", ids: [gmask], tokens: ["[gMASK]"] },
      "<sop>": { id: "<sop>", ids: [sop], tokens: ["<sop>"] },
    },
  },
  decoder: byteLevel,
  model: model(vocab, merges.map(([a, b]) => `${a} ${b}`), false),
};

// Whole words the merges never build, so only ignore_merges can produce them.
const wholeVocab = { ...vocab };
let wid = vocabSize;
for (const w of ["Hello", "ĠHello", "world", "Ġworld", "tokenizer", "Ġthe", "Ġand", "ä½łå¥½"]) {
  if (!(w in wholeVocab)) wholeVocab[w] = wid++;
}
const ignoreMerges = {
  ...glmLike,
  added_tokens: addedTokens(wid, false),
  model: model(wholeVocab, merges, true),
};

const nfc = {
  ...glmLike,
  normalizer: { type: "NFC" },
  added_tokens: addedTokens(vocabSize, true),
};

const out = new URL("./fixtures/", import.meta.url);
writeFileSync(new URL("glm_nfc.json", out), JSON.stringify(nfc) + "\n");
writeFileSync(new URL("glm_like.json", out), JSON.stringify(glmLike) + "\n");
writeFileSync(new URL("gpt2_like.json", out), JSON.stringify(gpt2Like) + "\n");
writeFileSync(new URL("glm_ignore_merges.json", out), JSON.stringify(ignoreMerges) + "\n");
console.log(`vocab ${vocabSize}, merges ${merges.length}`);
