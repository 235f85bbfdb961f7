// tiktoken (npm, Rust in WASM) on one file: MB/s of encode_ordinary with the gpt2 encoding, the
// twin of tokenizer_bench.cc. One untimed warm-up, then --reps timed encodes.
//   NODE_PATH=data/node_modules node tools/bench/tiktoken_bench.js FILE [REPS] [tiktoken|js-tiktoken]
'use strict';
const fs = require('fs');
const [file, repsArg, lib = 'tiktoken'] = process.argv.slice(2);
const reps = Number(repsArg || 5);
const text = fs.readFileSync(file, 'utf8');
const bytes = Buffer.byteLength(text, 'utf8');
let encode;
if (lib === 'tiktoken') {
  const enc = require('tiktoken').get_encoding('gpt2');
  encode = (s) => enc.encode_ordinary(s);
} else {
  const enc = require('js-tiktoken').getEncoding('gpt2');
  encode = (s) => enc.encode(s, [], []);
}
const tokens = encode(text).length;  // warm-up
// Wall time, and the process's CPU time (user + system, all of node's threads).
const mbs = [], cpuMbs = [];
for (let r = 0; r < reps; ++r) {
  const t0 = process.hrtime.bigint();
  const c0 = process.cpuUsage();
  encode(text);
  const c = process.cpuUsage(c0);
  const s = Number(process.hrtime.bigint() - t0) / 1e9;
  mbs.push(bytes / 1e6 / s);
  cpuMbs.push(bytes / 1e6 / ((c.user + c.system) / 1e6));
}
console.log(JSON.stringify({impl: lib, bytes, tokens, mb_per_s: mbs, mb_per_cpu_s: cpuMbs}));
