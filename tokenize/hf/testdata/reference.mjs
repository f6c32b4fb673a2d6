// Reference counts and renders for tokenize/hf's tests: Hugging Face's own JavaScript tokenizer
// (@huggingface/tokenizers) and Jinja (@huggingface/jinja) over a model's tokenizer.json and
// tokenizer_config.json. Reads {"dir", "texts": [...], "chats": [{messages, tools,
// add_generation_prompt, kwargs}]} as JSON on stdin, writes {"counts": [...], "ids": [[...], ...], "renders": [...],
// "render_counts": [...]} (a render that throws gives {"error": message}).
// Run: node reference.mjs NODE_MODULES_DIR < request.json
import { readFileSync } from "node:fs";
import { createRequire } from "node:module";
import path from "node:path";
import { pathToFileURL } from "node:url";

const modules = path.resolve(process.argv[2]);
const req = JSON.parse(readFileSync(0, "utf8"));
const load = async (name) => {
  const require = createRequire(path.join(modules, "noop.js"));
  const m = await import(pathToFileURL(require.resolve(name)).href);
  return m.default ?? m; // a CommonJS build arrives as the default export
};
const { Tokenizer } = await load("@huggingface/tokenizers");
const { Template } = await load("@huggingface/jinja");

const tokenizerJson = JSON.parse(readFileSync(path.join(req.dir, "tokenizer.json"), "utf8"));
const config = JSON.parse(readFileSync(path.join(req.dir, "tokenizer_config.json"), "utf8"));
const tok = new Tokenizer(tokenizerJson, config);
const encode = (text) => tok.encode(text, { add_special_tokens: false }).ids;
const count = (text) => encode(text).length;
const str = (t) => (t == null ? "" : typeof t === "string" ? t : t.content ?? "");
const template = new Template(config.chat_template);

const out = { counts: [], ids: [], renders: [], render_counts: [] };
for (const t of req.texts) {
  const ids = encode(t);
  out.counts.push(ids.length);
  out.ids.push(ids);
}
for (const c of req.chats) {
  try {
    const ctx = { ...(c.kwargs ?? {}), messages: c.messages, add_generation_prompt: c.add_generation_prompt,
      bos_token: str(config.bos_token), eos_token: str(config.eos_token) };
    if (c.tools) ctx.tools = c.tools;
    const text = template.render(ctx);
    out.renders.push(text);
    out.render_counts.push(count(text));
  } catch (e) {
    out.renders.push({ error: String(e.message ?? e) });
    out.render_counts.push(-1);
  }
}
process.stdout.write(JSON.stringify(out));
