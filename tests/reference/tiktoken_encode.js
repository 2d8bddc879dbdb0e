// The tokenizer oracle (tests/cli/tokenizer_oracle.sh): OpenAI's tiktoken (npm package
// `tiktoken`, the WASM build of its Rust core). Prints, for each file, one line of the
// `gpt2` encoding's token ids of the file's text (encode_ordinary: special tokens are
// ordinary text), and with --decode checks decode(encode(text)) == text.
const { get_encoding } = require("tiktoken");
const fs = require("fs");

const enc = get_encoding("gpt2");
const args = process.argv.slice(2);
const check = args[0] === "--decode";
for (const file of check ? args.slice(1) : args) {
  const bytes = fs.readFileSync(file);
  const ids = enc.encode_ordinary(bytes.toString("utf8"));
  if (check) {
    const back = Buffer.from(enc.decode(ids));
    if (!back.equals(bytes)) {
      console.error(`${file}: tiktoken's decode(encode(text)) differs from the text`);
      process.exit(1);
    }
  } else {
    console.log(Array.from(ids).join(" "));
  }
}
enc.free();
