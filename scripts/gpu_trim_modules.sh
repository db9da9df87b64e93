#!/usr/bin/env bash
# Copies node_modules/ into .gpu/nm without what the GPU machine never loads (the test-only
# packages openai and playwright-core, CommonJS builds, type declarations, source maps), so that
# the working tree plus .gpu/ fits the device tool's 64 MiB. scripts/gpu_check.sh restores it.
set -euo pipefail
cd "$(dirname "$0")/.."
rm -rf .gpu/nm && mkdir -p .gpu/nm && cp -a node_modules/. .gpu/nm/
cd .gpu/nm/.deno
for p in openai@*/node_modules/openai playwright-core@*/node_modules/playwright-core; do
  find $p -mindepth 1 -maxdepth 1 ! -name package.json -exec rm -rf {} +
done
rm -rf hono@*/node_modules/hono/dist/cjs hono@*/node_modules/hono/dist/types
# hono's adapters for other runtimes and its JSX, which strata never imports (hono/deno stays).
for a in aws-lambda bun cloudflare-pages cloudflare-workers lambda-edge netlify service-worker vercel; do
  rm -rf hono@*/node_modules/hono/dist/adapter/$a
done
rm -rf hono@*/node_modules/hono/dist/jsx hono@*/node_modules/hono/dist/middleware/jsx-renderer
# Deno loads the ES module builds: CommonJS and UMD builds, TypeScript sources and docs never load.
rm -rf fflate@*/node_modules/fflate/umd @huggingface+jinja@*/node_modules/@huggingface/jinja/src
find . \( -name "*.d.ts" -o -name "*.map" -o -name "*.d.cts" -o -name "*.d.mts" -o -name "*.cjs" \
  -o -name "README.md" -o -name "CHANGELOG.md" \) -delete
cd ../..
du -sh . | sed 's/^/.gpu: /'
