#!/usr/bin/env node
// A `solc` executable for forge and slither, backed by the pinned solc-js (npm solc@0.8.28).
// Supports what they call: `--version` and `--standard-json` (input on stdin, output on stdout).
'use strict';
const fs = require('fs');
const path = require('path');
const solc = require('solc');

const args = process.argv.slice(2);
if (args.includes('--version')) {
  process.stdout.write('solc, the solidity compiler commandline interface\nVersion: ' + solc.version() + '\n');
  process.exit(0);
}
if (!args.includes('--standard-json')) {
  process.stderr.write('solc-shim: only --version and --standard-json are supported\n');
  process.exit(2);
}
const roots = [process.cwd()];
for (let i = 0; i < args.length; i++) {
  if (['--base-path', '--include-path', '--allow-paths'].includes(args[i]) && args[i + 1]) {
    roots.push(...args[i + 1].split(','));
  }
}
function findImports(name) {
  for (const root of roots) {
    const file = path.resolve(root, name);
    if (fs.existsSync(file)) return { contents: fs.readFileSync(file, 'utf8') };
  }
  return { error: 'File not found: ' + name };
}
const input = fs.readFileSync(0, 'utf8');
process.stdout.write(solc.compile(input, { import: findImports }));
