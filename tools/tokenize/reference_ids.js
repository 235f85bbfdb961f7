// The reference side of reference_test.cc: GPT-2 ids from an npm tokenizer.
//   node reference_ids.js tiktoken|js-tiktoken|gpt-3-encoder IN OUT
// IN holds UTF-8 documents separated by NUL bytes; OUT gets, per document, its id count and then
// its ids, all little-endian u32. The packages are found through NODE_PATH (data/node_modules).
'use strict';
const fs = require('fs');
const [lib, inPath, outPath] = process.argv.slice(2);
const raw = fs.readFileSync(inPath);
const text = raw.toString('utf8');
if (!Buffer.from(text, 'utf8').equals(raw)) {
  console.error(`reference_ids.js: ${inPath} is not valid UTF-8, which the references cannot take`);
  process.exit(1);
}
let encode;
if (lib === 'tiktoken') {
  const enc = require('tiktoken').get_encoding('gpt2');
  encode = (s) => Array.from(enc.encode_ordinary(s));
} else if (lib === 'js-tiktoken') {
  const enc = require('js-tiktoken').getEncoding('gpt2');
  encode = (s) => enc.encode(s, [], []);  // no special tokens: ordinary text only
} else if (lib === 'gpt-3-encoder') {
  // A port of GPT-2's own encoder.py: merges only the pairs vocab.bpe lists, every occurrence of
  // the best-ranked one at a time. Quadratic in a document's length: keep documents short.
  const {encode: gpt3Encode} = require('gpt-3-encoder');
  encode = (s) => gpt3Encode(s);
} else {
  console.error(`reference_ids.js: unknown library '${lib}' (tiktoken, js-tiktoken, gpt-3-encoder)`);
  process.exit(1);
}
const out = [];
for (const doc of text.split('\0')) {
  const ids = encode(doc);
  out.push(ids.length);
  for (const id of ids) out.push(id);
}
fs.writeFileSync(outPath, Buffer.from(new Uint32Array(out).buffer));
