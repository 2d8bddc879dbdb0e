// The tokenizer oracle (tests/cli/tokenizer_oracle.sh): OpenAI's tiktoken (npm package
// `tiktoken`, the WASM build of its Rust core).
//   node tiktoken_encode.js [--encoding NAME] FILE...           one line of ids per file
//   node tiktoken_encode.js [--encoding NAME] --decode FILE...  checks decode(encode(x)) == x
//   node tiktoken_encode.js --encoding NAME --ranks OUT          writes the encoding's ranks
//        as a .tiktoken file ("base64(bytes) rank" per line), from the package's own data
// NAME defaults to gpt2; ids are encode_ordinary's (special tokens are ordinary text).
const { get_encoding } = require("tiktoken");
const fs = require("fs");
const path = require("path");

let args = process.argv.slice(2);
let name = "gpt2";
if (args[0] === "--encoding") {
  name = args[1];
  args = args.slice(2);
}
if (args[0] === "--ranks") {
  // The package stores ranks as lines "! FIRST b64 b64 ...": consecutive ranks from FIRST.
  const data = require(path.join(path.dirname(require.resolve("tiktoken")), "encoders", `${name}.json`));
  const out = [];
  for (const line of data.bpe_ranks.split("\n")) {
    const words = line.split(" ").filter((w) => w.length > 0);
    if (words[0] !== "!") continue;
    let rank = Number(words[1]);
    for (const b64 of words.slice(2)) out.push(`${b64} ${rank++}`);
  }
  fs.writeFileSync(args[1], out.join("\n") + "\n");
  process.exit(0);
}
const enc = get_encoding(name);
const check = args[0] === "--decode";
for (const file of check ? args.slice(1) : args) {
  const bytes = fs.readFileSync(file);
  const ids = enc.encode_ordinary(bytes.toString("utf8"));
  if (check) {
    const back = Buffer.from(enc.decode(ids));
    if (!back.equals(bytes)) {
      console.error(`${file}: tiktoken's ${name} decode(encode(text)) differs from the text`);
      process.exit(1);
    }
  } else {
    console.log(Array.from(ids).join(" "));
  }
}
enc.free();
