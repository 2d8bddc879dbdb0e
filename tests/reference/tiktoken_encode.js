// The tokenizer oracle (tests/cli/tokenizer_oracle.sh): OpenAI's tiktoken (npm package
// `tiktoken`, the WASM build of its Rust core).
//   node tiktoken_encode.js [--encoding NAME] FILE...           one line of ids per file
//   node tiktoken_encode.js [--encoding NAME] --decode FILE...  checks decode(encode(x)) == x
//   node tiktoken_encode.js --encoding NAME --ranks OUT          writes the encoding's ranks
//        as a .tiktoken file ("base64(bytes) rank" per line), from the package's own data
//   node tiktoken_encode.js --encoding NAME --specials OUT       writes a text holding every
//        special token of the encoding between ordinary words; prints "TEXT ID" for each, the
//        id tiktoken's encode(TEXT, "all") gives
//   node tiktoken_encode.js [--encoding NAME] --allow-special FILE...  encode(text, "all")
// NAME defaults to gpt2; ids are encode_ordinary's (special tokens are ordinary text)
// unless --allow-special.
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
if (args[0] === "--specials") {
  // The package's list of the encoding's special tokens; their ids from its encoder itself.
  const data = require(path.join(path.dirname(require.resolve("tiktoken")), "encoders", `${name}.json`));
  const texts = Object.keys(data.special_tokens);
  fs.writeFileSync(args[1], texts.map((t, i) => `word ${i}:${t}. next${t}${t}\n`).join("") + "end <|endoftext");
  for (const t of texts) {
    const ids = Array.from(enc.encode(t, "all"));
    if (ids.length !== 1) throw new Error(`${name}: tiktoken encodes ${t} as ${ids.length} ids`);
    console.log(`${t} ${ids[0]}`);
  }
  enc.free();
  process.exit(0);
}
const special = args[0] === "--allow-special";
const check = args[0] === "--decode";
for (const file of check || special ? args.slice(1) : args) {
  const bytes = fs.readFileSync(file);
  const text = bytes.toString("utf8");
  const ids = special ? enc.encode(text, "all") : enc.encode_ordinary(text);
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
