// Encodes every item of a corpus with @huggingface/tokenizers and prints a JSON array of
// {text, ids, decoded, add_special_tokens} for tokenizer_compare.
// Usage: node encode.mjs TOKENIZER_JSON CORPUS
//   CORPUS: *.jsonl (one JSON string per line) or plain text (one item per "\n"-separated line).
// Every item is encoded without special tokens; the first items are also encoded with them.
import { readFileSync } from "node:fs";
import { Tokenizer } from "@huggingface/tokenizers";

const [tokenizerPath, corpusPath] = process.argv.slice(2);
if (!tokenizerPath || !corpusPath) {
  console.error("usage: node encode.mjs TOKENIZER_JSON CORPUS");
  process.exit(2);
}
const tokenizerJson = JSON.parse(readFileSync(tokenizerPath, "utf8"));
const tokenizer = new Tokenizer(tokenizerJson, { clean_up_tokenization_spaces: false });

const raw = readFileSync(corpusPath, "utf8");
let texts;
if (corpusPath.endsWith(".jsonl")) {
  texts = raw.split("\n").filter((l) => l.trim() !== "").map((l) => JSON.parse(l));
} else {
  texts = raw.split("\n");
  if (texts.length > 0 && texts[texts.length - 1] === "") texts.pop();
}

const items = [];
const encodeOne = (text, addSpecial) => {
  const ids = tokenizer.encode(text, { add_special_tokens: addSpecial }).ids;
  const decoded = ids.length === 0
    ? ""
    : tokenizer.decode(ids, { skip_special_tokens: false, clean_up_tokenization_spaces: false });
  items.push({ text, ids, decoded, add_special_tokens: addSpecial });
};
texts.forEach((text, i) => {
  encodeOne(text, false);
  if (i < 8) encodeOne(text, true);
});
// The whole corpus as one text exercises long inputs and cross-line context.
encodeOne(texts.join("\n"), false);
process.stdout.write(JSON.stringify(items, null, 0) + "\n");
